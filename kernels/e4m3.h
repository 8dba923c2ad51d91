/*
 * The branch-free E4M3 "fn" encoder of the C references (internal):
 * kernels/mxfp8.c and kernels/fp8_block.c share it, so that both formats
 * round elements the same way; their CUDA twins use the hardware conversion
 * and the tests hold them equal. It is host and device code because NVFP4's
 * block scale rule (kernels/nvfp4_rules.h) encodes one E4M3 scale per block
 * with it on both sides.
 */
#ifndef REFIT_KERNELS_E4M3_H
#define REFIT_KERNELS_E4M3_H

#include "kernels/mxfp8.h"
#include "kernels/mxfp8_rules.h" /* refit_f32_bits, REFIT_HD */

#include <stdint.h>

/*
 * E4M3 "fn" byte of v: round to nearest even, saturate to +-448, NaN -> 0x7F.
 * Two candidate encodings are computed without branches and one is selected:
 *   normal (|v| >= 2^-6): round the fp32 mantissa to 3 bits (RNE by adding
 *     0x7FFFF plus the lowest kept bit), then rebias the exponent 127 -> 7;
 *   subnormal (|v| < 2^-6): |v| + 2^14 in fp32 has an ulp of exactly 2^-9, the
 *     E4M3 subnormal step, so the FPU's own RNE yields the 0..8 code.
 */
static inline REFIT_HD uint32_t refit_select(uint32_t cond, uint32_t a, uint32_t b) {
  /* cond ? a : b without a branch, so the element loop vectorizes. */
  return b ^ ((a ^ b) & (0u - cond));
}

static inline REFIT_HD uint8_t refit_e4m3_encode_inline(float v) {
  uint32_t u = refit_f32_bits(v);
  uint32_t sign = (u >> 24) & 0x80;
  uint32_t a = u & 0x7fffffffu;
  uint32_t normal = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
  uint32_t sub = refit_f32_bits(refit_f32_from_bits(a) + 16384.0f) - 0x46800000u;
  uint32_t q = refit_select(a < 0x3c800000u, sub, normal);          /* 2^-6 */
  q = refit_select(a >= 0x43e00000u, REFIT_MXFP8_E4M3_MAX_BITS, q); /* >=448 */
  q |= sign;
  q = refit_select(a > 0x7f800000u, REFIT_MXFP8_E4M3_NAN_BITS, q);
  return (uint8_t)q;
}

#endif /* REFIT_KERNELS_E4M3_H */

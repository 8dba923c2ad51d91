/*
 * The rules of NVFP4 (kernels/nvfp4.h) as inline host and device code shared
 * by the C reference and the CUDA twin (internal), so the two cannot drift
 * apart: the amax key, the global scale, the block scale and the E2M1
 * element encoding (the GPUs refit runs on have no E2M1 conversion
 * instruction before sm_100, so both sides use this one).
 *
 * Every operation is a single IEEE float32 multiply or division rounded to
 * nearest even, which C gives on the host and nvcc's defaults
 * (-prec-div=true, no fast math in kernels/) give on the device; no multiply
 * is followed by an add, so no FMA contraction can change a result.
 */
#ifndef REFIT_KERNELS_NVFP4_RULES_H
#define REFIT_KERNELS_NVFP4_RULES_H

#include "kernels/e4m3.h"        /* refit_e4m3_encode_inline */
#include "kernels/mxfp8_rules.h" /* refit_f32_bits, REFIT_HD */
#include "kernels/nvfp4.h"

#include <math.h>
#include <stdint.h>

/* 448 * 6: the largest E4M3 scale times the largest E2M1 value. */
#define REFIT_NVFP4_GLOBAL_NUMERATOR 2688.0f
/* FLT_MAX, which an infinite amax becomes, and the bits of fl(1/6). */
#define REFIT_NVFP4_FLT_MAX_BITS 0x7f7fffffu
#define REFIT_NVFP4_INV6_BITS 0x3e2aaaabu
/* The E2M1 code a NaN element encodes as: +6. */
#define REFIT_NVFP4_E2M1_NAN_CODE 0x7u

/* |bf16| bits as an amax key: orders like the magnitudes; NaN counts 0. */
static inline REFIT_HD uint32_t refit_nvfp4_key(uint16_t b) {
  const uint32_t a = b & 0x7fffu;
  return a > 0x7f80u ? 0u : a;
}

/* Rows of a [rows, k] matrix per amax tile (refit_nvfp4_amax_number):
 * REFIT_NVFP4_AMAX_TILE / k, at least 1. */
static inline REFIT_HD int64_t refit_nvfp4_amax_tile_rows(int64_t k) {
  return k >= REFIT_NVFP4_AMAX_TILE ? 1 : REFIT_NVFP4_AMAX_TILE / k;
}

/* gsf of a tensor whose amax key is `key`: fl(fl(1 / a) * 2688), +Inf amax
 * taken as FLT_MAX; 0 gives +Inf. */
static inline REFIT_HD float refit_nvfp4_global_rule(uint32_t key) {
  const float a = key == 0x7f80u ? refit_f32_from_bits(REFIT_NVFP4_FLT_MAX_BITS)
                                 : refit_f32_from_bits(key << 16);
  const float r = 1.0f / a;
  return r * REFIT_NVFP4_GLOBAL_NUMERATOR;
}

/* The value of a non-negative, non-NaN E4M3 byte (0x00 .. 0x7E), exactly. */
static inline REFIT_HD float refit_nvfp4_e4m3_value(uint32_t code) {
  const uint32_t e = code >> 3, m = code & 7u;
  if (e == 0) /* subnormal: m * 2^-9 */
    return (float)m * refit_f32_from_bits(0x3b000000u);
  return refit_f32_from_bits(((e + 120u) << 23) | (m << 20));
}

/* What the block rule needs of a tensor's global scale gsf, computed once
 * per tensor: per = fl(gsf * fl(1/6)) and decode = fl(1 / gsf). */
typedef struct {
  float per, decode;
} refit_nvfp4_tensor_rule_t;

static inline REFIT_HD refit_nvfp4_tensor_rule_t refit_nvfp4_tensor_rule(float gsf) {
  refit_nvfp4_tensor_rule_t t;
  t.per = gsf * refit_f32_from_bits(REFIT_NVFP4_INV6_BITS);
  t.decode = 1.0f / gsf;
  return t;
}

/*
 * The block rule: for a block whose amax key is `key` under the global scale
 * of t (refit_nvfp4_tensor_rule), *sf gets the stored E4M3 byte and the
 * return value is what the elements are multiplied by before their E2M1
 * encoding.
 */
static inline REFIT_HD float refit_nvfp4_block_rule(uint32_t key, refit_nvfp4_tensor_rule_t t,
                                                    uint8_t *sf) {
  if (key == 0) {
    *sf = 0;
    return 0.0f;
  }
  const float vmax = refit_f32_from_bits(key << 16);
  const float want = vmax * t.per;
  const uint8_t code = refit_e4m3_encode_inline(want);
  *sf = code;
  const float sfd = refit_nvfp4_e4m3_value(code) * t.decode;
  const float out = 1.0f / sfd;
  const float flt_max = refit_f32_from_bits(REFIT_NVFP4_FLT_MAX_BITS);
  return out > flt_max ? flt_max : out;
}

/* E2M1 code (low 4 bits) of v: round to nearest, ties to the even code,
 * saturate to +-6, the sign kept on zero, NaN -> +6. E2M1 is a float with
 * 2 exponent bits of bias 1 and 1 mantissa bit, so it is computed on v's
 * bits without a branch, as kernels/e4m3.h does for E4M3:
 *   normal (|v| >= 1): round the float32 mantissa to 1 bit (RNE: add
 *     0x1FFFFF plus the lowest kept bit), rebias the exponent 127 -> 1;
 *   subnormal (|v| < 1): |v| + 2^22 in float32 has an ulp of exactly 0.5,
 *     the E2M1 subnormal step, so the FPU's own RNE yields the 0..2 code;
 *   |v| >= 6 (and Inf) is code 7. */
static inline REFIT_HD uint32_t refit_nvfp4_e2m1(float v) {
  const uint32_t u = refit_f32_bits(v);
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t normal = ((a + 0x1fffffu + ((a >> 22) & 1u)) >> 22) - (126u << 1);
  const uint32_t sub = refit_f32_bits(refit_f32_from_bits(a) + 4194304.0f) - 0x4a800000u;
  uint32_t code = a < 0x3f800000u ? sub : normal; /* 1.0 */
  code = a >= 0x40c00000u ? 7u : code;            /* >= 6.0 */
  code |= (u >> 28) & 0x8u;
  return a > 0x7f800000u ? REFIT_NVFP4_E2M1_NAN_CODE : code;
}

/* The E2M1 code of a non-NaN v, the same as refit_nvfp4_e2m1's, in float
 * arithmetic that a GPU runs on its FMA pipe instead of integer work (the CUDA
 * twin's inner loop; a NaN is the caller's to route to refit_nvfp4_e2m1).
 * Rounding m = min(|v|, 6) to the E2M1 grid is the least of three lines,
 * each rounded to an integer, ties to even, by adding it to 2^23 (whose ulp
 * is 1) in one rounding:
 *   rne(2m)      codes 0..4 (steps of 0.5 below 2),
 *   rne(m) + 2   codes 4..6 (steps of 1 from 2 to 4),
 *   rne(m/2) + 4 codes 6..7 (steps of 2 from 4 to 6);
 * the grid is concave, so below 2 the first line is the least, from 2 to 4
 * the second and above 4 the third, and adding an even constant keeps the
 * parity the ties are decided by. The least sum's bits are 0x4B000000 plus
 * the magnitude code; v's sign bit is bit 3 (zero and -0.0 included). */
static inline REFIT_HD uint32_t refit_nvfp4_e2m1_finite(float v) {
  const float m = fminf(fabsf(v), 6.0f);
  const float t =
      fminf(fminf(fmaf(m, 2.0f, 8388608.0f), m + 8388610.0f), fmaf(m, 0.5f, 8388612.0f));
  return refit_f32_bits(t) - 0x4b000000u + ((refit_f32_bits(v) >> 31) << 3);
}

#endif /* REFIT_KERNELS_NVFP4_RULES_H */

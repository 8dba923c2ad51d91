/*
 * The scale rule of block FP8 (kernels/fp8_block.h) as inline code shared by
 * the C reference and the CUDA twin (internal), so the two cannot drift
 * apart. As for MXFP8, the E4M3 element conversion is not here: the GPU uses
 * its hardware conversion and the tests hold the two equal.
 *
 * The FP32 mode divides with IEEE division, which C gives on the host and
 * nvcc's default -prec-div=true gives on the device (no fast-math build of
 * kernels/); no multiply here is followed by an add, so no FMA contraction
 * can change a result.
 */
#ifndef REFIT_KERNELS_FP8_BLOCK_RULES_H
#define REFIT_KERNELS_FP8_BLOCK_RULES_H

#include "kernels/fp8_block.h"
#include "kernels/mxfp8_rules.h" /* refit_f32_bits, refit_mxfp8_scale_rule */

#include <stdint.h>

/* The canonical FP32 NaN stored as the scale of a block with a NaN. */
#define REFIT_FP8_BLOCK_NAN_BITS 0x7fc00000u
/* Largest finite E4M3 magnitude, the numerator of the FP32 scale. */
#define REFIT_FP8_BLOCK_E4M3_MAX 448.0f

/* |bf16| bits: orders like the magnitudes, NaN patterns above +Inf. */
static inline REFIT_HD uint32_t refit_fp8_block_amax_key(uint16_t b) {
  return b & 0x7fffu;
}

/* Does a block's amax key hold a NaN? */
static inline REFIT_HD int refit_fp8_block_key_nan(uint32_t key) { return key > 0x7f80u; }

/* *scale (what elements are multiplied by) and *scale_inv (what is stored)
 * for a block whose amax key is `key`. */
static inline REFIT_HD void refit_fp8_block_scale_rule(uint32_t key, int mode,
                                                       float *scale, float *scale_inv) {
  if (refit_fp8_block_key_nan(key)) {
    *scale = refit_f32_from_bits(REFIT_FP8_BLOCK_NAN_BITS);
    *scale_inv = *scale;
    return;
  }
  const float amax = refit_f32_from_bits(key << 16);
  if (mode == REFIT_FP8_SCALE_POW2) {
    /* E = clamp(ceil(log2(amax / 448)), -127, 127) + 127 is the MXFP8 scale
     * exponent of amax, capped at 254 and 0 for amax == 0. */
    const uint32_t E = refit_mxfp8_scale_rule(amax);
    if (E == 0) {
      *scale = 1.0f;
      *scale_inv = 1.0f;
    } else {
      /* 2^(127-E) for E in 1..254: a normal float down to 2^-126, then the
       * subnormal 2^-127; 2^(E-127) is always normal. */
      *scale = E == 254 ? refit_f32_from_bits(0x00400000u)
                        : refit_f32_from_bits((254u - E) << 23);
      *scale_inv = refit_f32_from_bits(E << 23);
    }
    return;
  }
  float s;
  if (key == 0 || key == 0x7f80u) {
    s = 1.0f; /* amax 0 or +Inf */
  } else {
    const float r = 1.0f / amax;
    s = r * REFIT_FP8_BLOCK_E4M3_MAX;
  }
  *scale = s;
  *scale_inv = 1.0f / s;
}

/* The BF16 NaN that vLLM's GPU conversion (__float2bfloat16) writes. */
#define REFIT_FP8_BLOCK_BF16_NAN 0x7fffu

/*
 * One element of vLLM's scaled_dequantize (fp8_utils.py):
 * (e4m3 q as float32) * scale_inv in float32, then bfloat16 round to
 * nearest even. The E4M3 value is exact in float32 (normal: (1 + m/8)
 * 2^(e-7); subnormal: m 2^-9; 0x7F / 0xFF: NaN); a NaN product is
 * REFIT_FP8_BLOCK_BF16_NAN, whatever its sign.
 */
static inline REFIT_HD uint16_t refit_fp8_block_dequant_rule(uint8_t q, float scale_inv) {
  const uint32_t e = (q >> 3) & 0xfu, mant = q & 7u;
  float v;
  if ((q & 0x7fu) == 0x7fu)
    v = refit_f32_from_bits(0x7fc00000u);
  else if (e == 0)
    v = (float)mant * 0.001953125f; /* m * 2^-9, exact */
  else
    v = refit_f32_from_bits((e + 120u) << 23 | mant << 20);
  if (q & 0x80u)
    v = -v;
  const uint32_t b = refit_f32_bits(v * scale_inv);
  if ((b & 0x7fffffffu) > 0x7f800000u)
    return REFIT_FP8_BLOCK_BF16_NAN;
  return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

#endif /* REFIT_KERNELS_FP8_BLOCK_RULES_H */

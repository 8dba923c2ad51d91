/*
 * The scale rule of MXFP8 as inline code shared by the C reference and the
 * CUDA twins (internal). One copy, so the two cannot drift apart; the E4M3
 * element conversion is not here because the GPU uses its hardware
 * instruction (cvt.rn.satfinite.e4m3x2.f32) and the tests hold the two equal.
 */
#ifndef REFIT_KERNELS_MXFP8_RULES_H
#define REFIT_KERNELS_MXFP8_RULES_H

#include "kernels/layout.h" /* REFIT_HD */
#include "kernels/mxfp8.h"

#include <stdint.h>
#include <string.h>

static inline REFIT_HD uint32_t refit_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

static inline REFIT_HD float refit_f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

/* |bf16| bits for the amax: NaN counts as 0; orders like the values. */
static inline REFIT_HD int32_t refit_mxfp8_amax_key(uint16_t b) {
  int32_t a = b & 0x7fff;
  return a > 0x7f80 ? 0 : a;
}

/*
 * E from amax by the GPU recipe: t = fp32(amax * 1/448) rounded to nearest
 * even (a lone multiply, so no FMA contraction can change it), then
 * E = exp(t) + (t not a power of two and t > 2^-127), capped at 254.
 */
static inline REFIT_HD uint32_t refit_mxfp8_scale_rule(float amax) {
  if (!(amax > 0.0f)) /* zero and NaN */
    return 0;
  uint32_t t = refit_f32_bits(amax * refit_f32_from_bits(REFIT_MXFP8_INV_448_BITS));
  uint32_t e = (t >> 23) & 0xff;
  uint32_t m = t & 0x7fffff;
  uint32_t E = e + ((m != 0) && !(e == 0 && m <= 0x400000));
  return E > 254 ? 254 : E;
}

/* 2^(127 - E) as fp32, or 0 for E == 0 (the contract's zero inverse scale). */
static inline REFIT_HD float refit_mxfp8_inv_scale(uint32_t E) {
  if (E == 0)
    return 0.0f;
  if (E == 254)
    return refit_f32_from_bits(0x00400000u); /* 2^-127, an fp32 subnormal */
  return refit_f32_from_bits((254u - E) << 23);
}

#endif /* REFIT_KERNELS_MXFP8_RULES_H */

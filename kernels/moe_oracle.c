/*
 * TRTLLM-gen MoE layout computed expert by expert, one step of the layout
 * contract at a time (section 5). This is the test oracle and the benchmark
 * baseline for the batched path in layout.c, and is written to share as
 * little with it as possible: it swaps and interleaves explicitly instead of
 * composing src13, applies the shuffle by scattering with dst32 instead of
 * gathering with src32, and swizzles by scattering every byte to its offset.
 */
#include "kernels/layout.h"

#include "core/error.h"

#include <stdlib.h>
#include <string.h>

/* Steps 1-3 on one matrix [m, w] (values: w = K; scales: w = K/32). */
static void refit_oracle_rows(const uint8_t *in, int64_t m, int64_t w, int gated,
                              uint8_t *tmp, uint8_t *out) {
  if (gated) {
    /* 1. swap [gate; up] -> [up; gate]. */
    memcpy(out, in + (m / 2) * w, (size_t)((m / 2) * w));
    memcpy(out + (m / 2) * w, in, (size_t)((m / 2) * w));
    /* 2. interleave: row 2i <- i, row 2i+1 <- m/2 + i. */
    for (int64_t i = 0; i < m / 2; i++) {
      memcpy(tmp + (2 * i) * w, out + i * w, (size_t)w);
      memcpy(tmp + (2 * i + 1) * w, out + (m / 2 + i) * w, (size_t)w);
    }
  } else {
    memcpy(tmp, in, (size_t)(m * w));
  }
  /* 3. epilogue-tile shuffle: input row r goes to output row dst32(r). */
  for (int64_t r = 0; r < m; r++)
    memcpy(out + refit_kernels_perm_index(REFIT_KERNELS_PERM_DST32, m, r) * w,
           tmp + r * w, (size_t)w);
}

/* One tensor (w13 or w2) of every expert. */
static refit_status_t refit_oracle_tensor(int64_t E, int64_t m, int64_t k,
                                          int gated, const uint8_t *values,
                                          const uint8_t *scales,
                                          uint8_t *values_out,
                                          uint8_t *scales_out) {
  int64_t cols = k / 32, kp = refit_round_up(cols, 4);
  int64_t mpad = refit_round_up(m, 128);
  uint8_t *tmp = malloc((size_t)(m * k));
  uint8_t *srows = malloc((size_t)(m * cols));
  if (tmp == NULL || srows == NULL) {
    free(tmp);
    free(srows);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "moe oracle: no scratch memory");
  }
  for (int64_t e = 0; e < E; e++) {
    refit_oracle_rows(values + e * m * k, m, k, gated, tmp,
                      values_out + e * m * k);
    refit_oracle_rows(scales + e * m * cols, m, cols, gated, tmp, srows);
    /* 4. pad to [mpad, kp] with zeros and 5. swizzle by the offset formula. */
    uint8_t *sw = scales_out + e * mpad * kp;
    memset(sw, 0, (size_t)(mpad * kp));
    for (int64_t r = 0; r < m; r++)
      for (int64_t c = 0; c < cols; c++)
        sw[refit_kernels_swizzle_offset(r, c, kp)] = srows[r * cols + c];
  }
  free(tmp);
  free(srows);
  return REFIT_OK;
}

refit_status_t refit_kernels_moe_transform_oracle(
    const refit_kernels_moe_shape_t *s, const uint8_t *w13,
    const uint8_t *w13_scale, const uint8_t *w2, const uint8_t *w2_scale,
    uint8_t *w13_out, uint8_t *w13_scale_out, uint8_t *w2_out,
    uint8_t *w2_scale_out) {
  REFIT_CHECK(refit_kernels_moe_check_shape(s, "oracle", NULL));
  if (w13 == NULL || w13_scale == NULL || w2 == NULL || w2_scale == NULL ||
      w13_out == NULL || w13_scale_out == NULL || w2_out == NULL ||
      w2_scale_out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "moe oracle: NULL buffer");
  int64_t m13 = s->gated ? 2 * s->intermediate : s->intermediate;
  REFIT_CHECK(refit_oracle_tensor(s->num_experts, m13, s->hidden, s->gated, w13,
                                  w13_scale, w13_out, w13_scale_out));
  return refit_oracle_tensor(s->num_experts, s->hidden, s->intermediate, 0, w2,
                             w2_scale, w2_out, w2_scale_out);
}

/*
 * Synthetic weights: every element is a pure function of (seed, version,
 * tensor name, global element index), so any rank can compute the expected
 * value of any element without a gather, and every refit sends new values.
 * Magnitudes are realistic: projections and experts mostly within 2^-12 ..
 * 2^-5 with rare larger outliers, norms in [1, 2).
 */
#ifndef REFIT_SYNTH_H
#define REFIT_SYNTH_H

#include "reshard/catalog.h"

#include <stdint.h>

typedef struct {
  uint64_t key; /* mixes seed, version and tensor name */
  int norm;     /* norms get values in [1, 2) */
} refit_synth_t;

void refit_synth_init(refit_synth_t *s, uint64_t seed, uint64_t version,
                      const refit_src_tensor_t *tensor);

static inline uint64_t refit_synth_mix(uint64_t x) {
  /* splitmix64 finalizer */
  x += UINT64_C(0x9e3779b97f4a7c15);
  x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
  return x ^ (x >> 31);
}

/* BF16 bits of global element `index` (row * cols + col). */
static inline uint16_t refit_synth_bf16(const refit_synth_t *s, int64_t index) {
  uint64_t h = refit_synth_mix(s->key ^ (uint64_t)index);
  uint16_t mant = (uint16_t)(h & 0x7f);
  if (s->norm)
    return (uint16_t)((127u << 7) | mant);
  uint16_t sign = (uint16_t)((h >> 7) & 1);
  /* 8 exponents 2^-12 .. 2^-5; one element in 256 is an outlier 2^-3. */
  uint16_t exp = (uint16_t)(115 + ((h >> 8) & 7));
  if (((h >> 11) & 0xff) == 0)
    exp = 124;
  return (uint16_t)((sign << 15) | (exp << 7) | mant);
}

/* Fill a shard [rows, cols] of `tensor` whose top-left element is global
 * (row0, col0). */
void refit_synth_fill(const refit_synth_t *s, const refit_src_tensor_t *tensor,
                      int64_t row0, int64_t col0, int64_t rows, int64_t cols,
                      uint16_t *dst);

#endif /* REFIT_SYNTH_H */

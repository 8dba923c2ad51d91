/*
 * The synthetic weight of one element, shared by the host and the device so
 * that both produce the same bits: a splitmix64 hash of (tensor key, global
 * element index) shaped into BF16 with realistic magnitudes. Projections and
 * experts get values of magnitude 2^-12 .. 2^-5 with one in 256 an outlier
 * near 2^-3, both signs; norms get values in [1, 2).
 */
#ifndef REFIT_KERNELS_SYNTH_RULES_H
#define REFIT_KERNELS_SYNTH_RULES_H

#include <stdint.h>

#if defined(__CUDACC__)
#define REFIT_SYNTH_HD __host__ __device__
#else
#define REFIT_SYNTH_HD
#endif

static inline REFIT_SYNTH_HD uint64_t refit_synth_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static inline REFIT_SYNTH_HD uint16_t refit_synth_value(uint64_t key, int norm,
                                                        int64_t index) {
  const uint64_t h = refit_synth_mix(key ^ (uint64_t)index);
  const uint16_t mant = (uint16_t)(h & 0x7f);
  if (norm)
    return (uint16_t)((127u << 7) | mant);
  const uint16_t sign = (uint16_t)((h >> 7) & 1);
  uint16_t exp = (uint16_t)(115 + ((h >> 8) & 7));
  if (((h >> 11) & 0xff) == 0)
    exp = 124;
  return (uint16_t)((sign << 15) | (exp << 7) | mant);
}

#endif /* REFIT_KERNELS_SYNTH_RULES_H */

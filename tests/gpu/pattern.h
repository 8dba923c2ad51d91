/*
 * Verifiable byte patterns for the GPU transport tests and refit-bench-link:
 * byte i of a buffer filled with `seed` is a hash of (seed, i / 8), so every
 * byte can be recomputed anywhere (host or device) without a copy of the
 * data. A buffer filled with another seed, stale data or poison is wrong in
 * almost every byte.
 */
#ifndef REFIT_TESTS_GPU_PATTERN_H
#define REFIT_TESTS_GPU_PATTERN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define REFIT_PATTERN_HD __host__ __device__
#else
#define REFIT_PATTERN_HD
#endif

static inline REFIT_PATTERN_HD uint8_t refit_pattern_byte(uint64_t seed,
                                                         uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + (i >> 3) + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (uint8_t)(z >> (8 * (i & 7)));
}

#ifdef __cplusplus
extern "C" {
#endif

/* Device-side fill and check (pattern.cu), for buffers too large to check
 * through the host. Both synchronize the device before returning; they
 * return 0 on success, else the cudaError_t. */
int refit_pattern_fill_device(void *buf, size_t bytes, uint64_t seed);
int refit_pattern_check_device(const void *buf, size_t bytes, uint64_t seed,
                               unsigned long long *wrong);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_TESTS_GPU_PATTERN_H */

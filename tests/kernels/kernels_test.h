/*
 * Shared helpers of the kernels tests: a seeded PRNG (seed from the clock, or
 * REFIT_TEST_SEED to replay; the seed is printed first so a failing run's log
 * carries it) and random BF16 data that is never all zeros.
 */
#ifndef REFIT_TESTS_KERNELS_TEST_H
#define REFIT_TESTS_KERNELS_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t kt_rng_state;

static inline uint64_t kt_rand(void) {
  /* xorshift64* */
  kt_rng_state ^= kt_rng_state >> 12;
  kt_rng_state ^= kt_rng_state << 25;
  kt_rng_state ^= kt_rng_state >> 27;
  return kt_rng_state * 0x2545F4914F6CDD1DULL;
}

/* Uniform in [lo, hi]. */
static inline int64_t kt_rand_range(int64_t lo, int64_t hi) {
  return lo + (int64_t)(kt_rand() % (uint64_t)(hi - lo + 1));
}

static inline void kt_seed(const char *test_name) {
  const char *env = getenv("REFIT_TEST_SEED");
  uint64_t seed = env != NULL ? strtoull(env, NULL, 0)
                              : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
  if (seed == 0)
    seed = 1;
  kt_rng_state = seed;
  printf("%s: seed %llu (replay with REFIT_TEST_SEED=%llu)\n", test_name,
         (unsigned long long)seed, (unsigned long long)seed);
  fflush(stdout);
}

static inline void kt_fill_bytes(uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)(kt_rand() >> 56);
  p[0] |= 1; /* never all zeros */
}

/*
 * Random finite BF16 with a per-row magnitude spread like trained weights:
 * exponents around 2^-4 with occasional outliers and exact zeros.
 */
static inline uint16_t kt_rand_bf16(void) {
  uint64_t r = kt_rand();
  uint16_t sign = (uint16_t)((r & 1) << 15);
  uint16_t man = (uint16_t)((r >> 1) & 0x7f);
  int exp = 127 - 4 + (int)((r >> 8) % 9) - 4;
  if (((r >> 20) & 63) == 0)
    exp = (int)((r >> 26) % 255); /* outlier: any exponent, subnormals too */
  if (((r >> 40) & 127) == 0)
    return sign; /* +-0 */
  return (uint16_t)(sign | (exp << 7) | man);
}

#endif /* REFIT_TESTS_KERNELS_TEST_H */

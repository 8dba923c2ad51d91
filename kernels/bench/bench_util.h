/*
 * What the benchmark programs of kernels/bench share: a monotonic clock,
 * allocation that faults its pages in before timing, the exit on a failed
 * call (benchmarks stop at the first error, naming it), and a seeded
 * generator (xorshift64*, geometric gaps) for reproducible inputs.
 */
#ifndef REFIT_KERNELS_BENCH_UTIL_H
#define REFIT_KERNELS_BENCH_UTIL_H

#include "refit/status.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void *xmalloc(size_t n) {
  void *p = malloc(n > 0 ? n : 1);
  if (p == NULL) {
    fprintf(stderr, "out of memory (%zu bytes)\n", n);
    exit(2);
  }
  memset(p, 0, n); /* fault pages in before timing */
  return p;
}

static inline void check(refit_status_t st, const char *what) {
  if (st != REFIT_OK) {
    fprintf(stderr, "%s failed: %s: %s\n", what, refit_status_name(st),
            refit_last_error());
    exit(2);
  }
}

/* xorshift64* on the caller's state (never 0). */
static inline uint64_t bench_rand(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545F4914F6CDD1DULL;
}

/* Uniform in [0, 1). */
static inline double bench_uniform(uint64_t *s) {
  return (double)(bench_rand(s) >> 11) * 0x1p-53;
}

/* A geometric count with mean `mean` (0 when mean <= 0). */
static inline size_t bench_gap(uint64_t *s, double mean) {
  if (mean <= 0)
    return 0;
  const double u = 1.0 - bench_uniform(s); /* (0, 1] */
  return (size_t)floor(log(u) / log1p(-1.0 / (1.0 + mean)));
}

#endif /* REFIT_KERNELS_BENCH_UTIL_H */

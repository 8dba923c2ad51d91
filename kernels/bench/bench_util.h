/*
 * What the benchmark programs of kernels/bench share: a monotonic clock,
 * allocation that faults its pages in before timing, and the exit on a
 * failed call (benchmarks stop at the first error, naming it).
 */
#ifndef REFIT_KERNELS_BENCH_UTIL_H
#define REFIT_KERNELS_BENCH_UTIL_H

#include "refit/status.h"

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

#endif /* REFIT_KERNELS_BENCH_UTIL_H */

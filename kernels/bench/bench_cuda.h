/*
 * What the GPU benchmark programs of kernels/bench share beside
 * bench_util.h: the exit on a failed CUDA call and device allocation.
 */
#ifndef REFIT_KERNELS_BENCH_CUDA_H
#define REFIT_KERNELS_BENCH_CUDA_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

static inline void cuda_check(cudaError_t err, const char *what) {
  if (err != cudaSuccess) {
    fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(err));
    exit(2);
  }
}

/* n bytes (at least 1) of device memory; exits naming the size if none. */
static inline void *dmalloc(size_t n) {
  void *p = NULL;
  if (cudaMalloc(&p, n > 0 ? n : 1) != cudaSuccess) {
    fprintf(stderr, "cudaMalloc of %zu bytes failed\n", n);
    exit(2);
  }
  return p;
}

#endif /* REFIT_KERNELS_BENCH_CUDA_H */

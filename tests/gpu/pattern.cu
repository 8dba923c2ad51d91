/*
 * Fill and check refit_pattern_byte patterns on the device: one byte per
 * thread iteration (grid-stride), so any alignment and length work; the
 * check counts wrong bytes with one atomic per block.
 */
#include "pattern.h"

#include <cuda_runtime.h>

__global__ void refit_pattern_fill_kernel(uint8_t *p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = refit_pattern_byte(seed, i);
}

__global__ void refit_pattern_check_kernel(const uint8_t *p, size_t n,
                                           uint64_t seed,
                                           unsigned long long *wrong) {
  __shared__ unsigned long long block_wrong;
  if (threadIdx.x == 0)
    block_wrong = 0;
  __syncthreads();
  unsigned long long mine = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    mine += p[i] != refit_pattern_byte(seed, i);
  if (mine)
    atomicAdd(&block_wrong, mine);
  __syncthreads();
  if (threadIdx.x == 0 && block_wrong)
    atomicAdd(wrong, block_wrong);
}

extern "C" int refit_pattern_fill_device(void *buf, size_t bytes,
                                         uint64_t seed) {
  if (bytes == 0)
    return 0;
  refit_pattern_fill_kernel<<<1024, 256>>>((uint8_t *)buf, bytes, seed);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess)
    err = cudaStreamSynchronize(0);
  return (int)err;
}

extern "C" int refit_pattern_check_device(const void *buf, size_t bytes,
                                          uint64_t seed,
                                          unsigned long long *wrong) {
  unsigned long long *d = NULL;
  cudaError_t err = cudaMalloc(&d, sizeof(*d));
  if (err != cudaSuccess)
    return (int)err;
  err = cudaMemset(d, 0, sizeof(*d));
  if (err == cudaSuccess && bytes > 0) {
    refit_pattern_check_kernel<<<1024, 256>>>((const uint8_t *)buf, bytes, seed,
                                              d);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess)
    err = cudaMemcpy(wrong, d, sizeof(*d), cudaMemcpyDeviceToHost);
  cudaFree(d);
  return (int)err;
}

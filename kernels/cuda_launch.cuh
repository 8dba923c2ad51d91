/*
 * Launch helpers shared by the CUDA sources of kernels/ (internal).
 */
#ifndef REFIT_KERNELS_CUDA_LAUNCH_CUH
#define REFIT_KERNELS_CUDA_LAUNCH_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#include <atomic>

extern "C" {
#include "core/error.h"
}

/*
 * Thread blocks of `threads` threads that fill the current device for
 * `kernel`: multiprocessors times resident blocks per multiprocessor. Grid-
 * stride kernels launch this many (or fewer when the work is smaller), so one
 * launch keeps every multiprocessor busy without a block per work item. On a
 * query failure it returns a plain 1024; the launch that follows reports the
 * real error.
 */
template <typename K>
static inline int64_t refit_cuda_filling_grid(K kernel, int threads) {
  int dev = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) !=
          cudaSuccess ||
      sms < 1 || per_sm < 1)
    return 1024;
  return static_cast<int64_t>(sms) * per_sm;
}

/* refit_cuda_filling_grid, queried once per device and kept in a cache the
 * caller owns (one per kernel and block size, e.g. a function-local static):
 * launches on a hot path pay no occupancy query. */
constexpr int kRefitCudaMaxDevices = 64;
struct refit_cuda_grid_cache_t {
  std::atomic<int64_t> grid[kRefitCudaMaxDevices];
};

template <typename K>
static inline int64_t refit_cuda_cached_grid(K kernel, int threads,
                                             refit_cuda_grid_cache_t &cache) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kRefitCudaMaxDevices)
    return refit_cuda_filling_grid(kernel, threads);
  int64_t g = cache.grid[dev].load(std::memory_order_relaxed);
  if (g == 0) {
    g = refit_cuda_filling_grid(kernel, threads);
    cache.grid[dev].store(g, std::memory_order_relaxed);
  }
  return g;
}

/* Blocks to launch for `work` blocks of work with a grid-stride kernel: the
 * work, at most the device-filling grid (cached), at least 1. */
template <typename K>
static inline unsigned refit_cuda_grid(K kernel, int threads,
                                       refit_cuda_grid_cache_t &cache, int64_t work) {
  const int64_t fill = refit_cuda_cached_grid(kernel, threads, cache);
  const int64_t g = work < fill ? work : fill;
  return static_cast<unsigned>(g < 1 ? 1 : g);
}

/* REFIT_ERR_CUDA naming `what` if the last launch failed. */
static inline refit_status_t refit_cuda_launch_check(const char *what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return REFIT_ERR(REFIT_ERR_CUDA, "%s (cuda): kernel launch failed: %s", what,
                     cudaGetErrorString(err));
  return REFIT_OK;
}

#endif /* REFIT_KERNELS_CUDA_LAUNCH_CUH */

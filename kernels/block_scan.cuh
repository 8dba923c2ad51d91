/*
 * Prefix sums over a warp and over a thread block, shared by the CUDA
 * sources of kernels/ (internal). Every thread of the warp, or of the block,
 * must call them: they use full-warp shuffles and block barriers.
 */
#ifndef REFIT_KERNELS_BLOCK_SCAN_CUH
#define REFIT_KERNELS_BLOCK_SCAN_CUH

/* Inclusive prefix of x over the warp's lanes (all 32 must call). */
template <typename T> __device__ inline T warp_inclusive_scan(T x) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const T y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d)
      x += y;
  }
  return x;
}

/*
 * Exclusive prefix of v over the thread block (Threads threads, all must
 * call); *total = the sum over the block. `sh` (shared memory) holds
 * Threads / 32 values; it may be reused once this returns.
 */
template <typename T, int Threads> __device__ inline T block_scan(T v, T *total, T *sh) {
  constexpr int warps = Threads / 32;
  static_assert(warps >= 1 && warps <= 32, "one warp scans the warps' sums");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const T x = warp_inclusive_scan(v);
  if (lane == 31)
    sh[warp] = x;
  __syncthreads();
  if (warp == 0) {
    T w = lane < warps ? sh[lane] : T(0);
#pragma unroll
    for (int d = 1; d < warps; d <<= 1) {
      const T y = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d)
        w += y;
    }
    if (lane < warps)
      sh[lane] = w;
  }
  __syncthreads();
  const T before = warp > 0 ? sh[warp - 1] : T(0);
  *total = sh[warps - 1];
  __syncthreads();
  return before + x - v;
}

#endif /* REFIT_KERNELS_BLOCK_SCAN_CUH */

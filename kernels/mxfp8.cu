/*
 * MXFP8 quantization, CUDA twin of kernels/mxfp8.c.
 *
 * Kernel refit_mxfp8_quantize_kernel
 *   computes  per 32-element block: amax (NaN ignored), E by the shared scale
 *             rule, q = E4M3 RNE satfinite of x * 2^(127-E), scale byte
 *             max(E, 1) - the rules of kernels/mxfp8.h.
 *   layout    in: BF16 [rows, k] with row stride src_stride elements;
 *             out: E4M3 [rows, k] (stride q_stride bytes), scales [rows, k/32]
 *             linear (stride scale_stride bytes).
 *   mapping   warp tiles of 8 * kUnroll consecutive blocks (row-major over
 *             rows * k/32, kernels/mxfp8_device.cuh: a quad of lanes per
 *             block, 16-byte loads, all of a lane's loads in flight before its
 *             arithmetic); a grid-stride loop over the tiles keeps a
 *             machine-filling grid busy whatever the shape.
 *   constraints k % 32 == 0; any alignment (narrower loads and stores are
 *             picked per address), 16-byte aligned rows take the wide path.
 */
#include "kernels/cuda_launch.cuh"
#include "kernels/mxfp8_cuda.h"
#include "kernels/mxfp8_device.cuh"

namespace {

constexpr int kThreads = 256;
/* Loads in flight per lane. On an H200, 8 (110 registers, half the warps
 * resident) was 15-17 % slower, and one thread per whole block (16-byte loads
 * 64 bytes apart across the warp) 22-40 % slower. */
constexpr int kUnroll = 4;

__global__ void __launch_bounds__(kThreads)
    refit_mxfp8_quantize_kernel(refit_mxfp8_dev_rows_t m) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) +
                   threadIdx.x / 32;
       w * 8 * kUnroll < m.total; w += warps)
    refit_mxfp8_dev_warp_tile<kUnroll>(m, w * 8 * kUnroll, lane);
}

void launch_quantize(const refit_mxfp8_dev_rows_t &m, cudaStream_t stream) {
  const int64_t tile = 8 * kUnroll, warps = (m.total + tile - 1) / tile;
  static refit_cuda_grid_cache_t grid;
  refit_mxfp8_quantize_kernel<<<refit_cuda_grid(refit_mxfp8_quantize_kernel, kThreads,
                                                grid,
                                                (warps + kThreads / 32 - 1) /
                                                    (kThreads / 32)),
                                kThreads, 0, stream>>>(m);
}

} // namespace

extern "C" refit_status_t
refit_mxfp8_quantize_rows_cuda(const uint16_t *src, int64_t rows, int64_t k,
                               int64_t src_stride_elems, uint8_t *q,
                               int64_t q_stride, uint8_t *scale,
                               int64_t scale_stride, cudaStream_t stream) {
  if (rows < 0 || k < 0 || k % REFIT_MXFP8_BLOCK != 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "mxfp8 quantize (cuda): shape [%lld, %lld]: K must be a "
                     "non-negative multiple of the 32-element scale block",
                     (long long)rows, (long long)k);
  if (rows == 0 || k == 0)
    return REFIT_OK;
  if (src == NULL || q == NULL || scale == NULL || src_stride_elems < k ||
      q_stride < k || scale_stride < k / 32)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "mxfp8 quantize (cuda): NULL buffer or stride smaller "
                     "than a row (src %lld elems, q %lld B, scale %lld B, K = "
                     "%lld)",
                     (long long)src_stride_elems, (long long)q_stride,
                     (long long)scale_stride, (long long)k);
  const refit_mxfp8_dev_rows_t m = {reinterpret_cast<const uint8_t *>(src),
                                    src_stride_elems * 2,
                                    q,
                                    q_stride,
                                    scale,
                                    scale_stride,
                                    k / 32,
                                    rows * (k / 32)};
  launch_quantize(m, stream);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return REFIT_ERR(REFIT_ERR_CUDA,
                     "mxfp8 quantize (cuda): launch of [%lld, %lld] failed: %s",
                     (long long)rows, (long long)k, cudaGetErrorString(err));
  return REFIT_OK;
}

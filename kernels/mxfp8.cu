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
#include "kernels/mxfp8_cuda.h"
#include "kernels/cuda_launch.cuh"
#include "kernels/mxfp8_device.cuh"

#include <stdlib.h>

namespace {

constexpr int kThreads = 256;

template <int U>
__global__ void __launch_bounds__(kThreads)
    refit_mxfp8_quantize_kernel(refit_mxfp8_dev_rows_t m) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
       w * 8 * U < m.total; w += warps)
    refit_mxfp8_dev_warp_tile<U>(m, w * 8 * U, lane);
}

/* Comparison variant for the benchmark: one thread per block. */
__global__ void __launch_bounds__(kThreads)
    refit_mxfp8_quantize_thread_kernel(refit_mxfp8_dev_rows_t m) {
  const uint32_t step = gridDim.x * kThreads;
  const uint32_t nb = static_cast<uint32_t>(m.nb);
  for (uint32_t g = blockIdx.x * kThreads + threadIdx.x; g < m.total; g += step) {
    const uint32_t r = g / nb, b = g - r * nb;
    m.scale[r * m.scale_pitch + b] =
        refit_mxfp8_dev_block(m.src + r * m.src_pitch + 64 * b, m.q + r * m.q_pitch + 32 * b);
  }
}

template <typename K>
void launch_grid(K kernel, int64_t threads_wanted, const refit_mxfp8_dev_rows_t &m,
                 cudaStream_t stream) {
  int64_t blocks = (threads_wanted + kThreads - 1) / kThreads;
  const int64_t fill = refit_cuda_filling_grid(kernel, kThreads);
  blocks = blocks < fill ? blocks : fill;
  kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(m);
}

void launch_quantize(const refit_mxfp8_dev_rows_t &m, cudaStream_t stream) {
  const int variant =
      getenv("REFIT_MXFP8_VARIANT") ? atoi(getenv("REFIT_MXFP8_VARIANT")) : 0;
  if (variant == 2 && m.total < INT32_MAX)
    launch_grid(refit_mxfp8_quantize_thread_kernel, m.total, m, stream);
  else if (variant == 1)
    launch_grid(refit_mxfp8_quantize_kernel<8>, (m.total + 63) / 64 * 32, m, stream);
  else
    launch_grid(refit_mxfp8_quantize_kernel<4>, (m.total + 31) / 32 * 32, m, stream);
}

}  // namespace

extern "C" refit_status_t refit_mxfp8_quantize_rows_cuda(
    const uint16_t *src, int64_t rows, int64_t k, int64_t src_stride_elems,
    uint8_t *q, int64_t q_stride, uint8_t *scale, int64_t scale_stride,
    cudaStream_t stream) {
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
                                    src_stride_elems * 2, q, q_stride, scale,
                                    scale_stride, k / 32, rows * (k / 32)};
  launch_quantize(m, stream);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return REFIT_ERR(REFIT_ERR_CUDA,
                     "mxfp8 quantize (cuda): launch of [%lld, %lld] failed: %s",
                     (long long)rows, (long long)k, cudaGetErrorString(err));
  return REFIT_OK;
}

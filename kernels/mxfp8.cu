/*
 * MXFP8 quantization, CUDA twin of kernels/mxfp8.c.
 *
 * Kernel refit_mxfp8_quantize_kernel
 *   computes  per 32-element block: amax (NaN ignored), E by the shared scale
 *             rule, q = cvt.rn.satfinite.e4m3(x * 2^(127-E)), scale byte
 *             max(E, 1) - the rules of kernels/mxfp8.h.
 *   layout    in: BF16 [rows, k] with row stride src_stride elements;
 *             out: E4M3 [rows, k] (stride q_stride bytes), scales [rows, k/32]
 *             linear (stride scale_stride bytes).
 *   mapping   one thread owns one whole block (kernels/mxfp8_device.cuh: four
 *             16-byte loads, amax in registers, two 16-byte stores, one scale
 *             byte); a grid-stride loop over the rows * k/32 blocks keeps a
 *             machine-filling grid busy whatever the shape. An earlier version
 *             gave a block to a quad of threads (8 elements each, shuffles for
 *             amax) and reached a fifth of copy bandwidth.
 *   constraints k % 32 == 0; any alignment (narrower loads and stores are
 *             picked per address), 16-byte aligned rows take the wide path.
 */
#include "kernels/mxfp8_cuda.h"
#include "kernels/cuda_launch.cuh"
#include "kernels/mxfp8_device.cuh"

namespace {

constexpr int kThreads = 256;

/* I: the index type; 32-bit when the block count fits, for cheap division. */
template <typename I>
__global__ void __launch_bounds__(kThreads)
    refit_mxfp8_quantize_kernel(const uint8_t *__restrict__ src, I total, I nb,
                                int64_t src_pitch, uint8_t *__restrict__ q,
                                int64_t q_stride, uint8_t *__restrict__ scale,
                                int64_t scale_stride) {
  const I step = static_cast<I>(gridDim.x) * kThreads;
  for (I g = static_cast<I>(blockIdx.x) * kThreads + threadIdx.x; g < total; g += step) {
    const I r = g / nb, b = g - r * nb;
    const uint8_t s = refit_mxfp8_dev_block(src + static_cast<int64_t>(r) * src_pitch + 64 * static_cast<int64_t>(b),
                                            q + static_cast<int64_t>(r) * q_stride + 32 * static_cast<int64_t>(b));
    scale[static_cast<int64_t>(r) * scale_stride + b] = s;
  }
}

template <typename I>
void launch_quantize(const uint16_t *src, int64_t rows, int64_t k, int64_t src_stride,
                     uint8_t *q, int64_t q_stride, uint8_t *scale, int64_t scale_stride,
                     cudaStream_t stream) {
  const int64_t total = rows * (k / 32);
  int64_t blocks = (total + kThreads - 1) / kThreads;
  const int64_t fill = refit_cuda_filling_grid(refit_mxfp8_quantize_kernel<I>, kThreads);
  blocks = blocks < fill ? blocks : fill;
  refit_mxfp8_quantize_kernel<I><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      reinterpret_cast<const uint8_t *>(src), static_cast<I>(total), static_cast<I>(k / 32),
      src_stride * 2, q, q_stride, scale, scale_stride);
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
  if (rows * (k / 32) < INT32_MAX)
    launch_quantize<uint32_t>(src, rows, k, src_stride_elems, q, q_stride, scale,
                              scale_stride, stream);
  else
    launch_quantize<uint64_t>(src, rows, k, src_stride_elems, q, q_stride, scale,
                              scale_stride, stream);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return REFIT_ERR(REFIT_ERR_CUDA,
                     "mxfp8 quantize (cuda): launch of [%lld, %lld] failed: %s",
                     (long long)rows, (long long)k, cudaGetErrorString(err));
  return REFIT_OK;
}

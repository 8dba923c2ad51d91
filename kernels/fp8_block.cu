/*
 * Block FP8 quantization, CUDA twin of kernels/fp8_block.c.
 *
 * Kernel refit_fp8_block_quantize_kernel
 *   computes  per 128 x 128 block: the amax key (|bf16| bits, NaN above
 *             +Inf; a partial block also counts the matrix's last element),
 *             scale and scale_inv by the shared rule
 *             (kernels/fp8_block_rules.h), q = E4M3 RNE satfinite of
 *             x * scale - the rules of kernels/fp8_block.h.
 *   layout    in: BF16 [rows, k] with row stride src_stride elements;
 *             out: E4M3 [rows, k] (stride q_stride bytes), FP32 scale_inv
 *             [ceil(rows/128), ceil(k/128)] (stride scale_stride elements).
 *   mapping   one thread block of 256 threads per 128 x 128 block (a grid-
 *             stride loop over blocks). A whole block with 16-byte aligned
 *             rows (the common case) is read once: thread t holds columns
 *             8(t%16) .. +7 of rows t/16, t/16+16, .., t/16+112 in registers
 *             (eight 16-byte loads in flight, 8-byte stores), so the second
 *             pass quantizes from registers. Other blocks (matrix edges, odd
 *             strides): lane l of warp w holds columns 4l .. 4l+3 of rows w,
 *             w+8, .., w+120 and the second pass reads the block again (from
 *             L2). The amax is a warp shuffle reduction, then one across the
 *             8 warps in shared memory.
 *   constraints any shape and alignment (narrower loads and stores are picked
 *             per address, and at the matrix's edges).
 */
#include "kernels/cuda_launch.cuh"
#include "kernels/fp8_block_cuda.h"
#include "kernels/fp8_block_device.cuh"
#include "kernels/fp8_block_rules.h"

namespace {

using namespace refit_fp8_block_dev;

__global__ void __launch_bounds__(kThreads)
    refit_fp8_block_quantize_kernel(refit_fp8_block_dev_t m) {
  __shared__ uint32_t warp_keys[kWarps];
  __shared__ float block_scale;
  for (int64_t blk = blockIdx.x; blk < m.nbr * m.nbc; blk += gridDim.x)
    refit_fp8_block_quantize_one(m, blk, warp_keys, &block_scale);
}

/* One thread per 4 elements of a row (grid-stride), the shared rule. */
__global__ void refit_fp8_block_dequantize_kernel(const uint8_t *q, int64_t rows,
                                                  int64_t k, int64_t q_stride,
                                                  const float *scale_inv,
                                                  int64_t scale_stride, uint16_t *out,
                                                  int64_t out_stride) {
  const int64_t per_row = (k + 3) / 4, total = rows * per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, c0 = (i - r * per_row) * 4;
    const float *s = scale_inv + (r / REFIT_FP8_BLOCK) * scale_stride;
    for (int64_t c = c0; c < c0 + 4 && c < k; c++)
      out[r * out_stride + c] =
          refit_fp8_block_dequant_rule(q[r * q_stride + c], s[c / REFIT_FP8_BLOCK]);
  }
}

} // namespace

extern "C" refit_status_t
refit_fp8_block_quantize_cuda(const uint16_t *src, int64_t rows, int64_t k,
                              int64_t src_stride_elems, refit_fp8_scale_t mode,
                              uint8_t *q, int64_t q_stride, float *scale_inv,
                              int64_t scale_stride, cudaStream_t stream) {
  REFIT_CHECK(refit_fp8_block_check("fp8_block quantize (cuda)", src, rows, k,
                                    src_stride_elems, mode, q, q_stride, scale_inv,
                                    scale_stride));
  if (rows == 0 || k == 0)
    return REFIT_OK;
  refit_fp8_block_dev_t m;
  m.src = src;
  m.src_stride = src_stride_elems;
  m.q = q;
  m.q_stride = q_stride;
  m.scale_inv = scale_inv;
  m.scale_stride = scale_stride;
  m.rows = rows;
  m.k = k;
  m.nbr = refit_fp8_block_count(rows);
  m.nbc = refit_fp8_block_count(k);
  m.mode = static_cast<int>(mode);
  m.aligned = (reinterpret_cast<uintptr_t>(src) & 15) == 0 && src_stride_elems % 8 == 0 &&
              (reinterpret_cast<uintptr_t>(q) & 7) == 0 && q_stride % 8 == 0;
  static refit_cuda_grid_cache_t grid;
  refit_fp8_block_quantize_kernel<<<refit_cuda_grid(refit_fp8_block_quantize_kernel,
                                                    kThreads, grid, m.nbr * m.nbc),
                                    kThreads, 0, stream>>>(m);
  return refit_cuda_launch_check("fp8_block quantize");
}

extern "C" refit_status_t refit_fp8_block_dequantize_cuda(
    const uint8_t *q, int64_t rows, int64_t k, int64_t q_stride, const float *scale_inv,
    int64_t scale_stride, uint16_t *out, int64_t out_stride_elems, cudaStream_t stream) {
  REFIT_CHECK(refit_fp8_block_check("fp8_block dequantize (cuda)", out, rows, k,
                                    out_stride_elems, REFIT_FP8_SCALE_FP32, q, q_stride,
                                    scale_inv, scale_stride));
  if (rows == 0 || k == 0)
    return REFIT_OK;
  const int64_t work = rows * ((k + 3) / 4);
  static refit_cuda_grid_cache_t grid;
  refit_fp8_block_dequantize_kernel<<<refit_cuda_grid(refit_fp8_block_dequantize_kernel,
                                                      kThreads, grid,
                                                      (work + kThreads - 1) / kThreads),
                                      kThreads, 0, stream>>>(
      q, rows, k, q_stride, scale_inv, scale_stride, out, out_stride_elems);
  return refit_cuda_launch_check("fp8_block dequantize");
}

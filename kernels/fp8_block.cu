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
#include "kernels/fp8_block_rules.h"
#include "kernels/mxfp8_device.cuh" /* refit_mxfp8_dev_cvt4 */

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

struct refit_fp8_block_dev_t {
  const uint16_t *src;
  int64_t src_stride; /* elements */
  uint8_t *q;
  int64_t q_stride; /* bytes */
  float *scale_inv;
  int64_t scale_stride; /* elements */
  int64_t rows, k;
  int64_t nbr, nbc; /* block rows and columns */
  int mode;
  int aligned; /* src and q rows 16- and 8-byte aligned */
};

/* Columns c .. c+3 of one row as two little-endian BF16 pairs; n (0..4) of
 * them are inside the matrix, the rest read as zero. */
__device__ inline void load4(const uint16_t *s, int n, uint32_t p[2]) {
  if (n == 4 && (reinterpret_cast<uintptr_t>(s) & 7) == 0) {
    const uint2 t = *reinterpret_cast<const uint2 *>(s);
    p[0] = t.x;
    p[1] = t.y;
    return;
  }
  uint32_t h[4];
#pragma unroll
  for (int i = 0; i < 4; i++)
    h[i] = i < n ? s[i] : 0u;
  p[0] = h[0] | h[1] << 16;
  p[1] = h[2] | h[3] << 16;
}

/* The low n bytes of w to d (n == 4 aligned: one word). */
__device__ inline void store4(uint8_t *d, int n, uint32_t w) {
  if (n == 4 && (reinterpret_cast<uintptr_t>(d) & 3) == 0) {
    *reinterpret_cast<uint32_t *>(d) = w;
    return;
  }
  for (int i = 0; i < n; i++)
    d[i] = static_cast<uint8_t>(w >> (8 * i));
}

__device__ inline uint32_t key_max(uint32_t a, uint32_t b) { return a > b ? a : b; }

/* The block's scale from each thread's largest key: thread 0 also stores
 * scale_inv. Every thread of the block must call it. */
__device__ inline float block_scale_of(const refit_fp8_block_dev_t &m, uint32_t key,
                                       int64_t br, int64_t bc, int partial,
                                       uint32_t *warp_keys, float *block_scale) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o /= 2)
    key = key_max(key, __shfl_xor_sync(0xffffffffu, key, o));
  if (lane == 0)
    warp_keys[warp] = key;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t k = 0;
    for (int w = 0; w < kWarps; w++)
      k = key_max(k, warp_keys[w]);
    if (partial) /* padded with the matrix's last element */
      k = key_max(k,
                  refit_fp8_block_amax_key(m.src[(m.rows - 1) * m.src_stride + m.k - 1]));
    float scale, inv;
    refit_fp8_block_scale_rule(k, m.mode, &scale, &inv);
    m.scale_inv[br * m.scale_stride + bc] = inv;
    *block_scale = scale;
  }
  __syncthreads();
  return *block_scale;
}

/* The largest key of two BF16 pairs. */
__device__ inline uint32_t key4(uint32_t a, uint32_t b) {
  const uint32_t k0 = key_max(a & 0x7fffu, (a >> 16) & 0x7fffu);
  const uint32_t k1 = key_max(b & 0x7fffu, (b >> 16) & 0x7fffu);
  return key_max(k0, k1);
}

__global__ void __launch_bounds__(kThreads)
    refit_fp8_block_quantize_kernel(refit_fp8_block_dev_t m) {
  __shared__ uint32_t warp_keys[kWarps];
  __shared__ float block_scale;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t blk = blockIdx.x; blk < m.nbr * m.nbc; blk += gridDim.x) {
    const int64_t br = blk / m.nbc, bc = blk - br * m.nbc;
    const int64_t r0 = br * REFIT_FP8_BLOCK;
    const int whole = r0 + REFIT_FP8_BLOCK <= m.rows && (bc + 1) * REFIT_FP8_BLOCK <= m.k;
    if (whole && m.aligned) {
      /* One read: the block in registers. */
      const int row = threadIdx.x / 16, col = 8 * (threadIdx.x % 16);
      const uint16_t *s = m.src + (r0 + row) * m.src_stride + bc * REFIT_FP8_BLOCK + col;
      uint4 v[8];
#pragma unroll
      for (int i = 0; i < 8; i++)
        v[i] = __ldcs(reinterpret_cast<const uint4 *>(s + 16 * i * m.src_stride));
      uint32_t key = 0;
#pragma unroll
      for (int i = 0; i < 8; i++)
        key = key_max(key, key_max(key4(v[i].x, v[i].y), key4(v[i].z, v[i].w)));
      const float scale = block_scale_of(m, key, br, bc, 0, warp_keys, &block_scale);
      uint8_t *d = m.q + (r0 + row) * m.q_stride + bc * REFIT_FP8_BLOCK + col;
#pragma unroll
      for (int i = 0; i < 8; i++) {
        uint2 w;
        w.x = refit_mxfp8_dev_cvt4(v[i].x, v[i].y, scale);
        w.y = refit_mxfp8_dev_cvt4(v[i].z, v[i].w, scale);
        __stcs(reinterpret_cast<uint2 *>(d + 16 * i * m.q_stride), w);
      }
    } else {
      const int64_t c = bc * REFIT_FP8_BLOCK + 4 * lane;
      const int64_t left = m.k - c;
      const int n = left >= 4 ? 4 : left > 0 ? static_cast<int>(left) : 0;
      const int64_t r_end = r0 + REFIT_FP8_BLOCK < m.rows ? r0 + REFIT_FP8_BLOCK : m.rows;

      /* Pass 1: this thread's largest key, then the block's. */
      uint32_t key = 0;
      for (int64_t r = r0 + warp; r < r_end; r += kWarps) {
        uint32_t p[2];
        load4(m.src + r * m.src_stride + c, n, p);
        key = key_max(key, key4(p[0], p[1]));
      }
      const float scale = block_scale_of(m, key, br, bc, !whole, warp_keys, &block_scale);

      /* Pass 2: the elements. */
      if (n > 0)
        for (int64_t r = r0 + warp; r < r_end; r += kWarps) {
          uint32_t p[2];
          load4(m.src + r * m.src_stride + c, n, p);
          store4(m.q + r * m.q_stride + c, n, refit_mxfp8_dev_cvt4(p[0], p[1], scale));
        }
    }
    /* warp_keys and block_scale are reused by the next block. */
    __syncthreads();
  }
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

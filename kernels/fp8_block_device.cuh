/*
 * The block FP8 quantizer's per-block device code (kernels/fp8_block.cu's
 * kernel, and the zero-copy path's batched one in kernels/direct.cu):
 * internal to kernels/, included by CUDA sources only.
 */
#ifndef REFIT_KERNELS_FP8_BLOCK_DEVICE_CUH
#define REFIT_KERNELS_FP8_BLOCK_DEVICE_CUH

#include "kernels/fp8_block_rules.h"
#include "kernels/mxfp8_device.cuh" /* refit_mxfp8_dev_cvt4 */

#include <stdint.h>

namespace refit_fp8_block_dev {

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

/* Block `blk` (row-major over nbr x nbc) of m, by the whole thread block of
 * kThreads threads; warp_keys and block_scale are the block's shared memory,
 * free again when it returns. */
__device__ inline void refit_fp8_block_quantize_one(const refit_fp8_block_dev_t &m,
                                                    int64_t blk, uint32_t *warp_keys,
                                                    float *block_scale_slot) {
  float &block_scale = *block_scale_slot;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  {
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

} // namespace refit_fp8_block_dev

#endif /* REFIT_KERNELS_FP8_BLOCK_DEVICE_CUH */

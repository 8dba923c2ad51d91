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
 *   mapping   a quad of 4 threads owns one block, 8 elements each (one 16-byte
 *             load, one 8-byte store); the quad reduces amax by shuffles.
 *   constraints k % 32 == 0; the vector path needs 16-byte aligned source
 *             rows and 8-byte aligned q rows, else byte-wise loads/stores.
 */
#include "kernels/mxfp8_cuda.h"
#include "kernels/mxfp8_rules.h"

#include <cuda_fp8.h>

extern "C" {
#include "core/error.h"
}

namespace {

constexpr int kThreads = 256;

__device__ inline float bf16_bits_to_float(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

template <bool kVec>
__global__ void refit_mxfp8_quantize_kernel(const uint16_t *__restrict__ src,
                                            int64_t rows, int64_t k,
                                            int64_t src_stride,
                                            uint8_t *__restrict__ q,
                                            int64_t q_stride,
                                            uint8_t *__restrict__ scale,
                                            int64_t scale_stride) {
  const int64_t per_row = k / 8;
  const int64_t gid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  /* Threads past the end still join the shuffles (whole quads are in or out). */
  const bool valid = gid < rows * per_row;
  const int64_t row = valid ? gid / per_row : 0;
  const int64_t g = valid ? gid % per_row : 0;
  const uint16_t *s = src + row * src_stride + g * 8;
  uint16_t x[8];
  if (valid) {
    if (kVec) {
      uint4 v = *reinterpret_cast<const uint4 *>(s);
      memcpy(x, &v, sizeof(v));
    } else {
      for (int i = 0; i < 8; i++)
        x[i] = s[i];
    }
  } else {
    for (int i = 0; i < 8; i++)
      x[i] = 0;
  }
  int32_t amax = 0;
  for (int i = 0; i < 8; i++)
    amax = max(amax, refit_mxfp8_amax_key(x[i]));
  amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  if (!valid)
    return;
  const uint32_t E = refit_mxfp8_scale_rule(bf16_bits_to_float(static_cast<uint16_t>(amax)));
  const float inv = refit_mxfp8_inv_scale(E);
  uint8_t out[8];
  for (int i = 0; i < 8; i += 2) {
    float2 f = make_float2(__fmul_rn(bf16_bits_to_float(x[i]), inv),
                           __fmul_rn(bf16_bits_to_float(x[i + 1]), inv));
    __nv_fp8x2_storage_t p = __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3);
    out[i] = static_cast<uint8_t>(p & 0xff);
    out[i + 1] = static_cast<uint8_t>(p >> 8);
  }
  uint8_t *d = q + row * q_stride + g * 8;
  if (kVec) {
    uint2 v;
    memcpy(&v, out, sizeof(v));
    *reinterpret_cast<uint2 *>(d) = v;
  } else {
    for (int i = 0; i < 8; i++)
      d[i] = out[i];
  }
  if ((g & 3) == 0)
    scale[row * scale_stride + g / 4] = static_cast<uint8_t>(E == 0 ? 1 : E);
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
  const bool vec = reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                   src_stride_elems % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(q) % 8 == 0 && q_stride % 8 == 0;
  const int64_t threads = rows * (k / 8);
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  if (vec)
    refit_mxfp8_quantize_kernel<true><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        src, rows, k, src_stride_elems, q, q_stride, scale, scale_stride);
  else
    refit_mxfp8_quantize_kernel<false><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        src, rows, k, src_stride_elems, q, q_stride, scale, scale_stride);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return REFIT_ERR(REFIT_ERR_CUDA,
                     "mxfp8 quantize (cuda): launch of [%lld, %lld] failed: %s",
                     (long long)rows, (long long)k, cudaGetErrorString(err));
  return REFIT_OK;
}

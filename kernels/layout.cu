/*
 * Runtime layouts, CUDA twins of kernels/layout.c. The same two primitives:
 *
 * Kernel refit_kernels_gather_rows_kernel
 *   computes  out[e][j][:] = in[e][perm(j)][:] or zeros when perm(j) >= rows_in
 *   layout    in [num, rows_in, k] bytes, out [num, rows_out, k] bytes
 *   mapping   one thread per 16-byte unit (or byte when k % 16 != 0 or a base
 *             is unaligned), grid-stride over all num * rows_out * k/16 units
 *             of the output in address order. A thread block per row (the
 *             earlier mapping) left most threads idle on 768-byte rows and
 *             paid a block launch per 2 KiB.
 *
 * Kernel refit_kernels_gather_swizzle_kernel
 *   computes  the 128x4 swizzle of scale rows gathered by perm(j), with rows
 *             padded to 128 and columns to Kp = round_up(cols, 4) by zeros
 *   layout    in [num, rows_in, cols] bytes; out num matrices of
 *             round_up(rows_in,128) * Kp bytes in the swizzled order
 *   mapping   one thread per 4-byte output word, walking the output in address
 *             order (coalesced stores); needs a 4-byte aligned output.
 *
 * perm(j) is computed from the shared formula (kernels/layout.h), with kind
 * -1 meaning identity.
 */
#include "kernels/mxfp8_cuda.h"
#include "kernels/cuda_launch.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kIdentity = -1;

__device__ inline int64_t perm_at(int kind, int64_t rows, int64_t j) {
  return kind == kIdentity
             ? j
             : refit_kernels_perm_index(static_cast<refit_kernels_perm_kind_t>(kind), rows, j);
}

/* V: the copy unit (uint4 or uint8_t); I: index type (32-bit when it fits). */
template <typename V, typename I>
__global__ void __launch_bounds__(kThreads)
    refit_kernels_gather_rows_kernel(const V *__restrict__ in, I rows_in, I units, int kind,
                                     I rows_out, I total, V *__restrict__ out) {
  const I step = static_cast<I>(gridDim.x) * kThreads;
  for (I u = static_cast<I>(blockIdx.x) * kThreads + threadIdx.x; u < total; u += step) {
    const I it = u / units, i = u - it * units; /* it = e * rows_out + j */
    const I e = it / rows_out, j = it - e * rows_out;
    const I r = static_cast<I>(perm_at(kind, rows_out, j));
    V v{};
    if (r < rows_in)
      v = in[(static_cast<int64_t>(e) * rows_in + r) * units + i];
    out[u] = v;
  }
}

__global__ void refit_kernels_gather_swizzle_kernel(const uint8_t *__restrict__ in,
                                                    int64_t rows_in, int64_t cols,
                                                    int kind, int64_t rows_pad,
                                                    int64_t kp, int64_t words,
                                                    uint32_t *__restrict__ out) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (w >= words)
    return;
  const int64_t per_matrix = rows_pad * kp / 4;
  const int64_t e = w / per_matrix, local = (w % per_matrix) * 4;
  const int64_t tile = local / (128 * kp), o = local % (128 * kp);
  const int64_t c4 = o / 512, r32 = (o % 512) / 16, rq = (o % 16) / 4;
  const int64_t j = tile * 128 + rq * 32 + r32;
  const int64_t r = perm_at(kind, rows_pad, j);
  uint32_t v = 0;
  if (r < rows_in) {
    const uint8_t *s = in + (e * rows_in + r) * cols;
    for (int c = 0; c < 4; c++)
      if (c4 * 4 + c < cols)
        v |= static_cast<uint32_t>(s[c4 * 4 + c]) << (8 * c);
  }
  out[w] = v;
}

template <typename V, typename I>
void launch_gather_as(const uint8_t *in, int64_t num, int64_t rows_in, int64_t units,
                      int kind, int64_t rows_out, uint8_t *out, cudaStream_t stream) {
  const int64_t total = num * rows_out * units;
  int64_t blocks = (total + kThreads - 1) / kThreads;
  const int64_t fill = refit_cuda_filling_grid(refit_kernels_gather_rows_kernel<V, I>, kThreads);
  blocks = blocks < fill ? blocks : fill;
  refit_kernels_gather_rows_kernel<V, I><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      reinterpret_cast<const V *>(in), static_cast<I>(rows_in), static_cast<I>(units), kind,
      static_cast<I>(rows_out), static_cast<I>(total), reinterpret_cast<V *>(out));
}

template <typename V>
void launch_gather(const uint8_t *in, int64_t num, int64_t rows_in, int64_t units, int kind,
                   int64_t rows_out, uint8_t *out, cudaStream_t stream) {
  if (num * rows_out * units == 0)
    return;
  if (num * (rows_out > rows_in ? rows_out : rows_in) * units < INT32_MAX)
    launch_gather_as<V, uint32_t>(in, num, rows_in, units, kind, rows_out, out, stream);
  else
    launch_gather_as<V, uint64_t>(in, num, rows_in, units, kind, rows_out, out, stream);
}

refit_status_t gather_rows(const uint8_t *in, int64_t num, int64_t rows_in,
                           int64_t k, int kind, int64_t rows_out, uint8_t *out,
                           cudaStream_t stream, const char *what) {
  const bool vec = k % 16 == 0 && reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (vec)
    launch_gather<uint4>(in, num, rows_in, k / 16, kind, rows_out, out, stream);
  else
    launch_gather<uint8_t>(in, num, rows_in, k, kind, rows_out, out, stream);
  return refit_cuda_launch_check(what);
}

refit_status_t gather_swizzle(const uint8_t *in, int64_t num, int64_t rows_in,
                              int64_t cols, int kind, uint8_t *out,
                              cudaStream_t stream, const char *what) {
  if (reinterpret_cast<uintptr_t>(out) % 4 != 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s (cuda): swizzled scale output %p is not 4-byte aligned",
                     what, static_cast<void *>(out));
  const int64_t rows_pad = refit_round_up(rows_in, 128), kp = refit_round_up(cols, 4);
  const int64_t words = num * rows_pad * kp / 4;
  const int64_t blocks = (words + kThreads - 1) / kThreads;
  if (words == 0)
    return REFIT_OK;
  refit_kernels_gather_swizzle_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      in, rows_in, cols, kind, rows_pad, kp, words, reinterpret_cast<uint32_t *>(out));
  return refit_cuda_launch_check(what);
}

}  // namespace

extern "C" refit_status_t refit_kernels_scale_swizzle_cuda(const uint8_t *lin,
                                                           int64_t num, int64_t rows,
                                                           int64_t cols, uint8_t *out,
                                                           cudaStream_t stream) {
  if (lin == NULL || out == NULL || num < 1 || rows < 1 || cols < 1)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "scale swizzle (cuda): bad arguments (lin %p, out %p, [%lld, "
                     "%lld, %lld])",
                     static_cast<const void *>(lin), static_cast<void *>(out),
                     (long long)num, (long long)rows, (long long)cols);
  return gather_swizzle(lin, num, rows, cols, kIdentity, out, stream, "scale swizzle");
}

extern "C" refit_status_t refit_kernels_moe_transform_tensor_cuda(
    const refit_kernels_moe_shape_t *s, refit_kernels_moe_tensor_t which,
    const uint8_t *values, const uint8_t *scales, uint8_t *values_out,
    uint8_t *scales_out, cudaStream_t stream) {
  refit_status_t st = refit_kernels_moe_check_shape(s, NULL, NULL);
  if (st != REFIT_OK)
    return st;
  if (values == NULL || scales == NULL || values_out == NULL || scales_out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "moe (cuda): NULL buffer");
  int64_t rows, k;
  refit_kernels_perm_kind_t perm_kind;
  if (!refit_kernels_moe_tensor_dims(s, which, &rows, &k, &perm_kind))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "moe (cuda): unknown tensor %d",
                     static_cast<int>(which));
  const int kind = perm_kind;
  const char *what = which == REFIT_KERNELS_MOE_W13 ? "moe w13" : "moe w2";
  st = gather_rows(values, s->num_experts, rows, k, kind, rows, values_out, stream, what);
  if (st != REFIT_OK)
    return st;
  return gather_swizzle(scales, s->num_experts, rows, k / 32, kind, scales_out, stream, what);
}

extern "C" refit_status_t refit_kernels_moe_transform_cuda(
    const refit_kernels_moe_shape_t *s, const uint8_t *w13, const uint8_t *w13_scale,
    const uint8_t *w2, const uint8_t *w2_scale, uint8_t *w13_out, uint8_t *w13_scale_out,
    uint8_t *w2_out, uint8_t *w2_scale_out, cudaStream_t stream) {
  refit_status_t st = refit_kernels_moe_transform_tensor_cuda(
      s, REFIT_KERNELS_MOE_W13, w13, w13_scale, w13_out, w13_scale_out, stream);
  if (st != REFIT_OK)
    return st;
  return refit_kernels_moe_transform_tensor_cuda(s, REFIT_KERNELS_MOE_W2, w2, w2_scale,
                                                 w2_out, w2_scale_out, stream);
}

extern "C" refit_status_t refit_kernels_dense_transform_cuda(
    refit_kernels_dense_backend_t backend, int64_t n, int64_t k, const uint8_t *q,
    const uint8_t *scale, uint8_t *weight_out, uint8_t *scale_out, cudaStream_t stream) {
  refit_status_t st = refit_kernels_check_shape(backend, NULL, n, k);
  if (st != REFIT_OK)
    return st;
  if (q == NULL || scale == NULL || weight_out == NULL || scale_out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "dense %s transform (cuda): NULL buffer",
                     refit_kernels_dense_backend_name(backend));
  const char *what = refit_kernels_dense_backend_name(backend);
  if (backend != REFIT_KERNELS_DENSE_FLASHINFER_TRTLLM) {
    /* cutlass and cutedsl keep the weight bytes. */
    cudaError_t err = cudaMemcpyAsync(weight_out, q, static_cast<size_t>(n * k),
                                      cudaMemcpyDeviceToDevice, stream);
    if (err != cudaSuccess)
      return REFIT_ERR(REFIT_ERR_CUDA, "dense %s transform (cuda): copy failed: %s", what,
                       cudaGetErrorString(err));
    return gather_swizzle(scale, 1, n, k / 32, kIdentity, scale_out, stream, what);
  }
  st = gather_rows(q, 1, n, k, REFIT_KERNELS_PERM_SRC32, refit_round_up(n, 128), weight_out,
                   stream, what);
  if (st != REFIT_OK)
    return st;
  return gather_swizzle(scale, 1, n, k / 32, REFIT_KERNELS_PERM_SRC32, scale_out, stream,
                        what);
}

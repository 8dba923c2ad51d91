/*
 * Runtime layouts, CUDA twins of kernels/layout.c. The same two primitives:
 *
 * Kernel refit_kernels_gather_rows_kernel
 *   computes  out[e][j][:] = in[e][perm(j)][:] or zeros when perm(j) >= rows_in
 *   layout    in [num, rows_in, k] bytes, out [num, rows_out, k] bytes
 *   mapping   a group of G lanes of one warp per output row, blocks for all
 *             num * rows_out rows (256 / G rows a block). The group computes
 *             e, j and perm(j) once per row; lane l then moves units l, l + G,
 *             l + 2G, ... of the row, kUnroll units at a time with every load
 *             issued before the stores. The unit is the widest of 16, 8, 4, 2
 *             and 1 bytes that divides k and both base addresses, so
 *             unaligned buffers take narrower units of the same kernel. G is
 *             the one of 32, 16, 8 and 4 that leaves the fewest lanes idle on
 *             a row (the larger on a tie): w13 rows of 2048 bytes (128 units)
 *             take G = 32 and four units a lane, w2 rows of 768 bytes (48
 *             units) G = 16 and three. The earlier mapping, a thread per
 *             16-byte unit of the whole output, paid two or three integer
 *             divisions and the permutation per unit: as much ALU time as
 *             memory time.
 *
 * Kernel refit_kernels_gather_swizzle_kernel
 *   computes  the 128x4 swizzle of scale rows gathered by perm(j), with rows
 *             padded to 128 and columns to Kp = round_up(cols, 4) by zeros
 *   layout    in [num, rows_in, cols] bytes; out num matrices of
 *             round_up(rows_in,128) * Kp bytes in the swizzled order
 *   mapping   one thread per C adjacent 16-byte output groups (C = 4, 2 or 1,
 *             the largest that divides Kp / 4), consecutive threads on
 *             consecutive groups (coalesced stores). The group at (matrix e,
 *             128-row tile, column group c4, r32) holds the rows
 *             j = tile*128 + rq*32 + r32 for rq = 0..3, four bytes each from
 *             columns 4*c4 .. 4*c4+3 (zeros past cols or past rows_in); the C
 *             groups of a thread share their rows, so it loads 4*C bytes of
 *             each of its four rows (one 16- or 8-byte load when cols and the
 *             input base allow, else 32-bit words when cols % 4 == 0, else
 *             bytes), all before its C 16-byte stores (4-byte or 1-byte stores
 *             when the output is less aligned). w13 scales of the Qwen3 layer
 *             (64 columns) take C = 4 and 16-byte loads, w2 (24) C = 2 and
 *             8-byte loads.
 *
 * perm(j) is computed from the shared formula (kernels/layout.h), with kind
 * -1 meaning identity. Both kernels index in 32 bits when the tensors allow,
 * and grid-stride only past kMaxBlocks blocks.
 */
#include "kernels/mxfp8_cuda.h"
#include "kernels/cuda_launch.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4; /* units in flight per lane of a row group */
constexpr int kIdentity = -1;

__device__ inline int64_t perm_at(int kind, int64_t rows, int64_t j) {
  return kind == kIdentity
             ? j
             : refit_kernels_perm_index(static_cast<refit_kernels_perm_kind_t>(kind), rows, j);
}

/* V: the copy unit (uint4 .. uint8_t); I: index type (32-bit when it fits).
 * Rows are units V wide; a group is 1 << log_g lanes of one warp. */
template <typename V, typename I>
__global__ void __launch_bounds__(kThreads)
    refit_kernels_gather_rows_kernel(const V *__restrict__ in, I rows_in, I units,
                                     int kind, I rows_out, I total_rows, int log_g,
                                     V *__restrict__ out) {
  const I g = static_cast<I>(1) << log_g, lane = threadIdx.x & (g - 1);
  const I groups = (static_cast<I>(gridDim.x) * kThreads) >> log_g;
  for (I it = (static_cast<I>(blockIdx.x) * kThreads + threadIdx.x) >> log_g;
       it < total_rows; it += groups) {
    const I e = it / rows_out, j = it - e * rows_out; /* it = e * rows_out + j */
    const I r = static_cast<I>(perm_at(kind, rows_out, j));
    const V *src = r < rows_in ? in + (e * rows_in + r) * units : nullptr;
    V *dst = out + it * units;
    for (I i = lane; i < units; i += kUnroll * g) {
      V v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; u++) {
        const I iu = i + u * g;
        v[u] = src != nullptr && iu < units ? src[iu] : V{};
      }
#pragma unroll
      for (int u = 0; u < kUnroll; u++)
        if (i + u * g < units)
          dst[i + u * g] = v[u];
    }
  }
}

/*
 * Scale columns 4*c4 .. 4*(c4 + C) - 1 of one row as C little-endian words w,
 * zeros past cols. load (bytes per load): 4 * C, one vector load (cols and
 * the input base multiples of 4C); 4, 32-bit words (multiples of 4); 1, bytes.
 */
template <int C, typename I>
__device__ inline void scale_words(const uint8_t *row, I c4, I cols, int load,
                                   uint32_t (&w)[C]) {
  const uint8_t *p = row + 4 * c4;
  if constexpr (C == 4) {
    if (load == 16) {
      const uint4 v = *reinterpret_cast<const uint4 *>(p);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
      return;
    }
  } else if constexpr (C == 2) {
    if (load == 8) {
      const uint2 v = *reinterpret_cast<const uint2 *>(p);
      w[0] = v.x, w[1] = v.y;
      return;
    }
  }
  if (load >= 4) {
#pragma unroll
    for (int c = 0; c < C; c++)
      w[c] = reinterpret_cast<const uint32_t *>(p)[c];
  } else {
#pragma unroll
    for (int c = 0; c < C; c++) {
      w[c] = 0;
      for (I b = 0; b < 4; b++)
        if (4 * (c4 + c) + b < cols)
          w[c] |= static_cast<uint32_t>(p[4 * c + b]) << (8 * b);
    }
  }
}

/* C: 16-byte groups per thread (adjacent column groups c4 of the same rows);
 * store: 16, 4 or 1, the widest store the output's alignment allows. */
template <int C, typename I>
__global__ void __launch_bounds__(kThreads)
    refit_kernels_gather_swizzle_kernel(const uint8_t *__restrict__ in, I rows_in, I cols,
                                        int kind, I tiles, I kq, I total, int load,
                                        int store, uint8_t *__restrict__ out) {
  const I step = static_cast<I>(gridDim.x) * kThreads;
  for (I t = static_cast<I>(blockIdx.x) * kThreads + threadIdx.x; t < total; t += step) {
    /* t = ((e * tiles + tile) * kq / C + c4 / C) * 32 + r32, kq = Kp / 4 */
    const I r32 = t % 32, q = t / 32;
    const I et = q / (kq / C), c4 = (q - et * (kq / C)) * C;
    const I e = et / tiles, tile = et - e * tiles;
    uint32_t w[4][C];
#pragma unroll
    for (int rq = 0; rq < 4; rq++) {
      const I j = tile * 128 + static_cast<I>(rq) * 32 + r32;
      const I r = static_cast<I>(perm_at(kind, tiles * 128, j));
      if (r < rows_in) {
        scale_words<C>(in + (e * rows_in + r) * cols, c4, cols, load, w[rq]);
      } else {
#pragma unroll
        for (int c = 0; c < C; c++)
          w[rq][c] = 0;
      }
    }
#pragma unroll
    for (int c = 0; c < C; c++) {
      /* group (e, tile, c4 + c, r32) of the output */
      uint8_t *d = out + ((q * C + c) * 32 + r32) * 16;
      if (store == 16) {
        *reinterpret_cast<uint4 *>(d) = make_uint4(w[0][c], w[1][c], w[2][c], w[3][c]);
      } else if (store == 4) {
#pragma unroll
        for (int rq = 0; rq < 4; rq++)
          reinterpret_cast<uint32_t *>(d)[rq] = w[rq][c];
      } else {
#pragma unroll
        for (int b = 0; b < 16; b++)
          d[b] = static_cast<uint8_t>(w[b / 4][c] >> (8 * (b % 4)));
      }
    }
  }
}

/*
 * Blocks for `work` items of `per_block` items a block: enough for all of
 * them, so that the block scheduler balances the multiprocessors (one
 * machine-filling wave that grid-strides measured 5% slower on the w13/w2
 * gathers of an H200: its last rows ran on a few multiprocessors). Past
 * kMaxBlocks the kernels grid-stride; the cap keeps thread indices and the
 * stride below 2^31, so that 32-bit indexing cannot wrap.
 */
constexpr int64_t kMaxBlocks = (int64_t{1} << 31) / kThreads;

unsigned blocks_for(int64_t work, int64_t per_block) {
  const int64_t blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

/* log2 of the lanes per row: of 32, 16, 8 and 4 the one that leaves the
 * fewest lanes idle on a row of `units` units, the larger on a tie. */
int group_log2(int64_t units) {
  int best = 5;
  for (int lg = 4; lg >= 2; lg--)
    if (refit_round_up(units, int64_t{1} << lg) <
        refit_round_up(units, int64_t{1} << best))
      best = lg;
  return best;
}

template <typename V, typename I>
void launch_gather_as(const uint8_t *in, int64_t num, int64_t rows_in, int64_t units,
                      int kind, int64_t rows_out, uint8_t *out, cudaStream_t stream) {
  const int64_t rows = num * rows_out;
  const int log_g = group_log2(units);
  refit_kernels_gather_rows_kernel<V, I>
      <<<blocks_for(rows, kThreads >> log_g), kThreads, 0, stream>>>(
          reinterpret_cast<const V *>(in), static_cast<I>(rows_in), static_cast<I>(units),
          kind, static_cast<I>(rows_out), static_cast<I>(rows), log_g,
          reinterpret_cast<V *>(out));
}

template <typename V>
void launch_gather(const uint8_t *in, int64_t num, int64_t rows_in, int64_t k, int kind,
                   int64_t rows_out, uint8_t *out, cudaStream_t stream) {
  const int64_t units = k / static_cast<int64_t>(sizeof(V));
  if (num * (rows_out > rows_in ? rows_out : rows_in) * units < INT32_MAX)
    launch_gather_as<V, uint32_t>(in, num, rows_in, units, kind, rows_out, out, stream);
  else
    launch_gather_as<V, uint64_t>(in, num, rows_in, units, kind, rows_out, out, stream);
}

refit_status_t gather_rows(const uint8_t *in, int64_t num, int64_t rows_in, int64_t k,
                           int kind, int64_t rows_out, uint8_t *out, cudaStream_t stream,
                           const char *what) {
  if (num * rows_out * k == 0)
    return REFIT_OK;
  /* The widest unit that divides k and both addresses. */
  const uintptr_t a = reinterpret_cast<uintptr_t>(in) | reinterpret_cast<uintptr_t>(out) |
                      static_cast<uintptr_t>(k);
  if (a % 16 == 0)
    launch_gather<uint4>(in, num, rows_in, k, kind, rows_out, out, stream);
  else if (a % 8 == 0)
    launch_gather<uint2>(in, num, rows_in, k, kind, rows_out, out, stream);
  else if (a % 4 == 0)
    launch_gather<uint32_t>(in, num, rows_in, k, kind, rows_out, out, stream);
  else if (a % 2 == 0)
    launch_gather<uint16_t>(in, num, rows_in, k, kind, rows_out, out, stream);
  else
    launch_gather<uint8_t>(in, num, rows_in, k, kind, rows_out, out, stream);
  return refit_cuda_launch_check(what);
}

template <int C, typename I>
void launch_swizzle_as(const uint8_t *in, int64_t num, int64_t rows_in, int64_t cols,
                       int kind, uint8_t *out, cudaStream_t stream) {
  const int64_t tiles = refit_round_up(rows_in, 128) / 128,
                kq = refit_round_up(cols, 4) / 4;
  const int64_t total = num * tiles * kq / C * 32; /* threads: C 16-byte groups each */
  const uintptr_t i = reinterpret_cast<uintptr_t>(in),
                  o = reinterpret_cast<uintptr_t>(out);
  const int load = (cols | i) % (4 * C) == 0 ? 4 * C : (cols | i) % 4 == 0 ? 4 : 1;
  const int store = o % 16 == 0 ? 16 : o % 4 == 0 ? 4 : 1;
  refit_kernels_gather_swizzle_kernel<C, I>
      <<<blocks_for(total, kThreads), kThreads, 0, stream>>>(
          in, static_cast<I>(rows_in), static_cast<I>(cols), kind, static_cast<I>(tiles),
          static_cast<I>(kq), static_cast<I>(total), load, store, out);
}

/* C: as many column groups per thread as divide kq, up to 4 (16-byte loads). */
template <typename I>
void launch_swizzle(const uint8_t *in, int64_t num, int64_t rows_in, int64_t cols,
                    int kind, uint8_t *out, cudaStream_t stream) {
  const int64_t kq = refit_round_up(cols, 4) / 4;
  if (kq % 4 == 0)
    launch_swizzle_as<4, I>(in, num, rows_in, cols, kind, out, stream);
  else if (kq % 2 == 0)
    launch_swizzle_as<2, I>(in, num, rows_in, cols, kind, out, stream);
  else
    launch_swizzle_as<1, I>(in, num, rows_in, cols, kind, out, stream);
}

refit_status_t gather_swizzle(const uint8_t *in, int64_t num, int64_t rows_in,
                              int64_t cols, int kind, uint8_t *out, cudaStream_t stream,
                              const char *what) {
  const int64_t bytes = num * refit_kernels_swizzle_bytes(rows_in, cols);
  if (bytes == 0)
    return REFIT_OK;
  /* The output is the larger tensor and bounds every index of both. */
  if (bytes < INT32_MAX)
    launch_swizzle<uint32_t>(in, num, rows_in, cols, kind, out, stream);
  else
    launch_swizzle<uint64_t>(in, num, rows_in, cols, kind, out, stream);
  return refit_cuda_launch_check(what);
}

} // namespace

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

extern "C" refit_status_t refit_kernels_nvfp4_moe_transform_cuda(
    refit_kernels_moe_backend_t backend, const refit_kernels_moe_shape_t *s,
    refit_kernels_moe_tensor_t which, const uint8_t *packed, const uint8_t *lin,
    uint8_t *w_out, uint8_t *s_out, cudaStream_t stream) {
  refit_status_t st = refit_kernels_nvfp4_moe_check_shape(backend, s, NULL);
  if (st != REFIT_OK)
    return st;
  int64_t rows, k;
  refit_kernels_perm_kind_t unused;
  if (!refit_kernels_moe_tensor_dims(s, which, &rows, &k, &unused))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "nvfp4 moe (cuda): unknown tensor %d",
                     static_cast<int>(which));
  if (packed == NULL || lin == NULL || w_out == NULL || s_out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "nvfp4 moe (cuda): NULL buffer");
  int kind;
  refit_kernels_nvfp4_moe_perm(backend, which, &kind);
  const char *what = which == REFIT_KERNELS_MOE_W13 ? "nvfp4 moe w13" : "nvfp4 moe w2";
  st = gather_rows(packed, s->num_experts, rows, (k + 1) / 2, kind, rows, w_out, stream,
                   what);
  if (st != REFIT_OK)
    return st;
  return gather_swizzle(lin, s->num_experts, rows, (k + 15) / 16, kind, s_out, stream,
                        what);
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
  int kind;
  const int64_t rows = refit_kernels_dense_rows(backend, n, &kind);
  if (kind < 0) {
    /* cutlass and cutedsl keep the weight bytes. */
    cudaError_t err = cudaMemcpyAsync(weight_out, q, static_cast<size_t>(n * k),
                                      cudaMemcpyDeviceToDevice, stream);
    if (err != cudaSuccess)
      return REFIT_ERR(REFIT_ERR_CUDA, "dense %s transform (cuda): copy failed: %s", what,
                       cudaGetErrorString(err));
    return gather_swizzle(scale, 1, n, k / 32, kIdentity, scale_out, stream, what);
  }
  const refit_kernels_perm_kind_t perm = static_cast<refit_kernels_perm_kind_t>(kind);
  st = gather_rows(q, 1, n, k, perm, rows, weight_out, stream, what);
  if (st != REFIT_OK)
    return st;
  return gather_swizzle(scale, 1, n, k / 32, perm, scale_out, stream, what);
}

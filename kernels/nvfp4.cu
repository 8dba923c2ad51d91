/*
 * NVFP4 quantization, CUDA twin of kernels/nvfp4.c.
 *
 * Kernel refit_nvfp4_quantize_kernel
 *   computes  per block of 16 elements of a row: the amax key (|bf16| bits,
 *             NaN ignored), the E4M3 scale byte and the output scale by the
 *             shared rule (kernels/nvfp4_rules.h), then the E2M1 code of each
 *             element times that scale, two to a byte - the rules of
 *             kernels/nvfp4.h.
 *   layout    in: BF16 [rows, k] with row stride src_stride elements;
 *             out: packed E2M1 [rows, ceil(k/2)] (stride q_stride bytes),
 *             E4M3 scales [rows, ceil(k/16)] (stride sf_stride bytes).
 *   mapping   one thread per block (a grid-stride loop over rows * blocks,
 *             32-bit indices where they fit, no division per block; the
 *             tensor's 1/gsf and gsf/6 computed once, kernels/nvfp4_rules.h).
 *             The elements take float arithmetic, which runs on the FMA
 *             pipe (Hopper has no E2M1 conversion, and integer work is what
 *             bounded this kernel): the amax by fmaxf and the E2M1 code by
 *             refit_nvfp4_e2m1_finite; a block holding a NaN takes
 *             refit_nvfp4_e2m1 instead, whose rule for NaN is its own.
 *             Memory:
 *             a full block at a 16-byte-aligned address is two 16-byte loads
 *             and, at an 8-byte-aligned output, one 8-byte store, so a warp
 *             reads 1 KiB and writes 256 contiguous bytes of a row; a partial
 *             block or an unaligned address takes element-wise loads and
 *             byte stores.
 *             Stacked matrices (experts) under their own global scales
 *             are one launch: each block's matrix is tracked with its row.
 *   constraints any shape and alignment.
 *
 * Kernel refit_nvfp4_amax_kernel
 *   computes  the amax key (kernels/nvfp4_rules.h) of a BF16 matrix, merged
 *             into one uint32 by atomicMax.
 *   mapping   a grid-stride loop over groups of 8 elements of a row (one
 *             16-byte load where the row start, stride and K allow, else
 *             element loads); a warp reduces by shuffles, its lane 0 merges.
 */
#include "kernels/cuda_launch.cuh"
#include "kernels/nvfp4_cuda.h"
#include "kernels/nvfp4_rules.h"

namespace {

constexpr int kThreads = 256;
/* Matrices of one quantizer launch: their rules (8 bytes each) travel in the
 * kernel's parameters, 2 KiB of the 4 KiB allowed. */
constexpr int kMaxGroups = 256;

struct refit_nvfp4_dev_t {
  const uint16_t *src;
  int64_t src_stride; /* elements */
  uint8_t *q;
  int64_t q_stride; /* bytes */
  uint8_t *sf;
  int64_t sf_stride; /* bytes */
  int64_t rows, k, nb;
  /* Rows [g * group_rows, (g + 1) * group_rows) are quantized under rule[g]
   * (a launch's matrices: one, or up to kMaxGroups stacked experts). */
  int64_t group_rows;
  refit_nvfp4_tensor_rule_t rule[kMaxGroups];
  float *decode; /* NULL, or rule[g].decode to decode[g] by block 0 */
};

/* Index is uint32_t where rows * nb fits (the usual case: 64-bit index
 * arithmetic per block costs more than the block's own), else int64_t. A
 * thread's (row, block) pair advances by the grid's stride with one compare,
 * not a division per block. */
template <typename Index>
__global__ void __launch_bounds__(kThreads)
    refit_nvfp4_quantize_kernel(const __grid_constant__ refit_nvfp4_dev_t m) {
  const Index total = static_cast<Index>(m.rows * m.nb), nb = static_cast<Index>(m.nb);
  const Index step = static_cast<Index>(gridDim.x) * blockDim.x;
  const Index step_r = step / nb, step_b = step - step_r * nb;
  const Index group_rows = static_cast<Index>(m.group_rows);
  Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
  Index r = i / nb, b = i - r * nb;
  Index g = r / group_rows, gr = r - g * group_rows; /* the matrix and its row */
  if (m.decode != NULL && blockIdx.x == 0 && threadIdx.x * m.group_rows < m.rows)
    m.decode[threadIdx.x] = m.rule[threadIdx.x].decode;
  for (; i < total; i += step) {
    const int64_t x0 = static_cast<int64_t>(b) * REFIT_NVFP4_BLOCK;
    const int n =
        m.k - x0 < REFIT_NVFP4_BLOCK ? static_cast<int>(m.k - x0) : REFIT_NVFP4_BLOCK;
    const uint16_t *s = m.src + static_cast<int64_t>(r) * m.src_stride + x0;
    /* The block as 8 pairs of BF16 (element 2j low); a partial block's
     * missing elements are +0, which change no amax and encode as 0. */
    uint32_t w[8];
    if (n == REFIT_NVFP4_BLOCK && (reinterpret_cast<uintptr_t>(s) & 15) == 0) {
      const uint4 a = reinterpret_cast<const uint4 *>(s)[0];
      const uint4 c = reinterpret_cast<const uint4 *>(s)[1];
      w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
      w[4] = c.x, w[5] = c.y, w[6] = c.z, w[7] = c.w;
    } else {
#pragma unroll
      for (int j = 0; j < 8; j++)
        w[j] = (2 * j < n ? s[2 * j] : 0u) | (2 * j + 1 < n ? s[2 * j + 1] : 0u) << 16;
    }
    float v[REFIT_NVFP4_BLOCK];
#pragma unroll
    for (int j = 0; j < 8; j++) {
      v[2 * j] = __uint_as_float(w[j] << 16);
      v[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
    /* The amax key as a float maximum (fmaxf drops NaN, as the key rule
     * does); the sum is NaN when an element is (or +Inf meets -Inf), which
     * sends the block to the reference encoder. */
    float amax = 0.0f, sum = 0.0f;
#pragma unroll
    for (int j = 0; j < REFIT_NVFP4_BLOCK; j++) {
      amax = fmaxf(amax, fabsf(v[j]));
      sum += v[j];
    }
    uint8_t code;
    const float out =
        refit_nvfp4_block_rule(__float_as_uint(amax) >> 16, m.rule[g], &code);
    m.sf[static_cast<int64_t>(r) * m.sf_stride + b] = code;
    uint32_t packed[2] = {0, 0};
    if (sum == sum) {
#pragma unroll
      for (int j = 0; j < REFIT_NVFP4_BLOCK; j++)
        packed[j / 8] += refit_nvfp4_e2m1_finite(v[j] * out) << (4 * (j % 8));
    } else {
#pragma unroll
      for (int j = 0; j < REFIT_NVFP4_BLOCK; j++)
        packed[j / 8] |= refit_nvfp4_e2m1(v[j] * out) << (4 * (j % 8));
    }
    uint8_t *d = m.q + static_cast<int64_t>(r) * m.q_stride + x0 / 2;
    const int bytes = (n + 1) / 2;
    if (bytes == 8 && (reinterpret_cast<uintptr_t>(d) & 7) == 0) {
      *reinterpret_cast<uint2 *>(d) = make_uint2(packed[0], packed[1]);
    } else {
      for (int j = 0; j < bytes; j++)
        d[j] = static_cast<uint8_t>(packed[j / 4] >> (8 * (j % 4)));
    }
    r += step_r;
    gr += step_r;
    b += step_b;
    if (b >= nb) {
      b -= nb;
      r++;
      gr++;
    }
    if (gr >= group_rows) { /* a division only where a matrix ends */
      const Index d = gr / group_rows;
      g += d;
      gr -= d * group_rows;
    }
  }
}

/* The amax key of the n <= 8 elements at s: one 16-byte load when vec. */
__device__ __forceinline__ uint32_t refit_nvfp4_group_key(const uint16_t *s, int vec,
                                                          int n) {
  uint32_t m = 0;
  if (vec) {
    const uint4 a = *reinterpret_cast<const uint4 *>(s);
    const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int j = 0; j < 4; j++)
      m = max(m, max(refit_nvfp4_key(static_cast<uint16_t>(w[j])),
                     refit_nvfp4_key(static_cast<uint16_t>(w[j] >> 16))));
  } else {
    for (int j = 0; j < n; j++)
      m = max(m, refit_nvfp4_key(s[j]));
  }
  return m;
}

/* A warp's largest m, in every lane. */
__device__ __forceinline__ uint32_t refit_nvfp4_warp_max(uint32_t m) {
#pragma unroll
  for (int d = 16; d > 0; d /= 2)
    m = max(m, __shfl_xor_sync(0xffffffffu, m, d));
  return m;
}

__global__ void __launch_bounds__(kThreads)
    refit_nvfp4_amax_kernel(const uint16_t *src, int64_t rows, int64_t k, int64_t stride,
                            int vec, uint32_t *key) {
  const int64_t groups = (k + 7) / 8, total = rows * groups;
  uint32_t m = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / groups, c = (i - r * groups) * 8;
    m = max(m, refit_nvfp4_group_key(src + r * stride + c, vec,
                                     k - c < 8 ? static_cast<int>(k - c) : 8));
  }
  m = refit_nvfp4_warp_max(m);
  if ((threadIdx.x & 31) == 0 && m != 0)
    atomicMax(key, m);
}

/* The table's tiles (refit_nvfp4_amax_number), a grid-stride loop over
 * them: a thread block finds its tile's descriptor (the last whose tile0 is
 * not past it), reads the tile's rows in groups of 8 and merges the tile's
 * key into the descriptor's slot with one atomicMax. */
__global__ void __launch_bounds__(kThreads)
    refit_nvfp4_amax_table_kernel(const refit_nvfp4_amax_desc_t *descs, int64_t n,
                                  int64_t tiles) {
  __shared__ uint32_t warp_max[kThreads / 32];
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (descs[mid].tile0 <= t)
        lo = mid;
      else
        hi = mid - 1;
    }
    const refit_nvfp4_amax_desc_t d = descs[lo];
    const int64_t per = refit_nvfp4_amax_tile_rows(d.k), r0 = (t - d.tile0) * per;
    const uint32_t groups = static_cast<uint32_t>((d.k + 7) / 8);
    const uint32_t work =
        static_cast<uint32_t>(d.rows - r0 < per ? d.rows - r0 : per) * groups;
    const int vec = (reinterpret_cast<uintptr_t>(d.src) & 15) == 0 && d.k % 8 == 0 &&
                    d.stride % 8 == 0;
    uint32_t m = 0;
    for (uint32_t i = threadIdx.x; i < work; i += blockDim.x) {
      const uint32_t r = i / groups;
      const int64_t c = static_cast<int64_t>(i - r * groups) * 8;
      m = max(m, refit_nvfp4_group_key(d.src + (r0 + r) * d.stride + c, vec,
                                       d.k - c < 8 ? static_cast<int>(d.k - c) : 8));
    }
    m = refit_nvfp4_warp_max(m);
    if ((threadIdx.x & 31) == 0)
      warp_max[threadIdx.x / 32] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kThreads / 32; w++)
        m = max(m, warp_max[w]);
      if (m != 0)
        atomicMax(d.slot, m);
    }
    __syncthreads();
  }
}

} // namespace

extern "C" refit_status_t refit_nvfp4_amax_key_cuda(const uint16_t *src, int64_t rows,
                                                    int64_t k, int64_t src_stride_elems,
                                                    uint32_t *key, cudaStream_t stream) {
  /* The C twin's argument rules, and a slot to merge into. */
  if (rows < 0 || k < 0 || key == NULL ||
      (rows > 0 && k > 0 && (src == NULL || src_stride_elems < k)))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "nvfp4 amax (cuda): source %p [%lld, %lld] with stride %lld, key %p: "
                     "needs a shape >= 0, a source and a stride >= K, and a key",
                     static_cast<const void *>(src), (long long)rows, (long long)k,
                     (long long)src_stride_elems, static_cast<void *>(key));
  if (rows == 0 || k == 0)
    return REFIT_OK;
  const int vec = (reinterpret_cast<uintptr_t>(src) & 15) == 0 && k % 8 == 0 &&
                  src_stride_elems % 8 == 0;
  static refit_cuda_grid_cache_t grid;
  const int64_t work = (rows * ((k + 7) / 8) + kThreads - 1) / kThreads;
  refit_nvfp4_amax_kernel<<<refit_cuda_grid(refit_nvfp4_amax_kernel, kThreads, grid, work),
                            kThreads, 0, stream>>>(src, rows, k, src_stride_elems, vec, key);
  return refit_cuda_launch_check("nvfp4 amax");
}

extern "C" refit_status_t
refit_nvfp4_quantize_groups_cuda(const uint16_t *src, int64_t groups, int64_t rows,
                                 int64_t k, int64_t src_stride_elems, const float *gsf,
                                 uint8_t *q, int64_t q_stride, uint8_t *sf,
                                 int64_t sf_stride, float *decode, cudaStream_t stream) {
  REFIT_CHECK(refit_nvfp4_groups_check("nvfp4 quantize (cuda)", src, groups, rows, k,
                                       src_stride_elems, gsf, q, q_stride, sf,
                                       sf_stride));
  if (groups == 0)
    return REFIT_OK;
  if (rows == 0 || k == 0) { /* no element: only the decode scales, copied */
    for (int64_t g = 0; g < groups && decode != NULL; g++) {
      /* From pageable memory: staged before the call returns. */
      const float d = refit_nvfp4_global_decode(gsf[g]);
      const cudaError_t err =
          cudaMemcpyAsync(decode + g, &d, sizeof(d), cudaMemcpyHostToDevice, stream);
      if (err != cudaSuccess)
        return REFIT_ERR(REFIT_ERR_CUDA, "nvfp4 quantize (cuda): decode scale %lld: %s",
                         (long long)g, cudaGetErrorString(err));
    }
    return REFIT_OK;
  }
  refit_nvfp4_dev_t m;
  m.src_stride = src_stride_elems;
  m.q_stride = q_stride;
  m.sf_stride = sf_stride;
  m.k = k;
  m.nb = refit_nvfp4_scale_cols(k);
  m.group_rows = rows;
  for (int64_t g0 = 0; g0 < groups; g0 += kMaxGroups) {
    const int64_t n = groups - g0 < kMaxGroups ? groups - g0 : kMaxGroups;
    m.src = src + g0 * rows * src_stride_elems;
    m.q = q + g0 * rows * q_stride;
    m.sf = sf + g0 * rows * sf_stride;
    m.rows = n * rows;
    m.decode = decode != NULL ? decode + g0 : NULL;
    for (int64_t g = 0; g < n; g++)
      m.rule[g] = refit_nvfp4_tensor_rule(gsf[g0 + g]);
    const int64_t work = (m.rows * m.nb + kThreads - 1) / kThreads;
    /* Below 2^31 blocks, i plus a grid's stride never wraps 32 bits. */
    if (m.rows * m.nb <= INT32_MAX) {
      static refit_cuda_grid_cache_t grid32;
      refit_nvfp4_quantize_kernel<uint32_t>
          <<<refit_cuda_grid(refit_nvfp4_quantize_kernel<uint32_t>, kThreads, grid32,
                             work),
             kThreads, 0, stream>>>(m);
    } else {
      static refit_cuda_grid_cache_t grid64;
      refit_nvfp4_quantize_kernel<int64_t>
          <<<refit_cuda_grid(refit_nvfp4_quantize_kernel<int64_t>, kThreads, grid64,
                             work),
             kThreads, 0, stream>>>(m);
    }
    REFIT_CHECK(refit_cuda_launch_check("nvfp4 quantize"));
  }
  return REFIT_OK;
}

extern "C" refit_status_t refit_nvfp4_quantize_cuda(
    const uint16_t *src, int64_t rows, int64_t k, int64_t src_stride_elems, float gsf,
    uint8_t *q, int64_t q_stride, uint8_t *sf, int64_t sf_stride, cudaStream_t stream) {
  return refit_nvfp4_quantize_groups_cuda(src, 1, rows, k, src_stride_elems, &gsf, q,
                                          q_stride, sf, sf_stride, NULL, stream);
}

extern "C" refit_status_t refit_nvfp4_amax_keys_cuda(const refit_nvfp4_amax_desc_t *descs,
                                                     int64_t n, int64_t tiles,
                                                     cudaStream_t stream) {
  if (n < 0 || tiles < 0 || (tiles > 0 && (descs == NULL || n == 0)))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "nvfp4 amax (cuda table): %lld descriptors at %p with %lld tiles: "
                     "needs a numbered table (refit_nvfp4_amax_number)",
                     (long long)n, static_cast<const void *>(descs), (long long)tiles);
  if (tiles == 0)
    return REFIT_OK;
  static refit_cuda_grid_cache_t grid;
  refit_nvfp4_amax_table_kernel<<<refit_cuda_grid(refit_nvfp4_amax_table_kernel, kThreads,
                                                  grid, tiles),
                                  kThreads, 0, stream>>>(descs, n, tiles);
  return refit_cuda_launch_check("nvfp4 amax (table)");
}

/*
 * Synthetic weights and comparison on the device, CUDA twins of
 * refit_synth_rect, refit_synth_rows and refit_compare (kernels/datapath.h,
 * kernels/datapath_cuda.h): verification's kernels, not the data path's.
 *
 * Kernel refit_dp_synth_kernel, refit_dp_compare_kernel: grid-stride loops,
 * 8 synthetic values (one 16-byte store) per thread; 16-byte compares.
 */
#include "kernels/cuda_launch.cuh"
#include "kernels/datapath_cuda.h"
#include "kernels/synth_rules.h"

namespace {

constexpr int kThreads = 256;
constexpr unsigned kFull = 0xffffffffu; /* every lane of a warp */

/* ---- Synthetic values and comparison --------------------------------------
 */

template <bool kRows>
__global__ void __launch_bounds__(kThreads)
    refit_dp_synth_kernel(refit_synth_key_t key, int64_t tensor_cols, int64_t row0,
                          int64_t col0, const refit_synth_key_t *keys,
                          const int64_t *bases, int64_t cols, int64_t total,
                          uint16_t *dst) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads * 8;
  for (int64_t e0 =
           (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * 8;
       e0 < total; e0 += step) {
    int64_t r = e0 / cols, c = e0 - r * cols;
    uint16_t v[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
      if (e0 + k < total)
        v[k] = kRows ? refit_synth_value(&keys[r], bases[r] + c)
                     : refit_synth_value(&key, (row0 + r) * tensor_cols + col0 + c);
      if (++c == cols) {
        c = 0;
        r++;
      }
    }
    uint16_t *d = dst + e0;
    if (e0 + 8 <= total && reinterpret_cast<uintptr_t>(d) % 16 == 0) {
      uint4 u;
      memcpy(&u, v, sizeof(u));
      *reinterpret_cast<uint4 *>(d) = u;
    } else {
      for (int k = 0; k < 8 && e0 + k < total; k++)
        d[k] = v[k];
    }
  }
}

refit_status_t launch_synth(bool by_rows, const refit_synth_key_t *key,
                            int64_t tensor_cols, int64_t row0, int64_t col0,
                            const refit_synth_key_t *keys, const int64_t *bases,
                            int64_t rows, int64_t cols, uint16_t *dst,
                            cudaStream_t stream) {
  const char *what = by_rows ? "synth rows" : "synth rect";
  if (rows < 0 || cols < 0 || (rows * cols > 0 && dst == NULL) ||
      (rows * cols > 0 && (by_rows ? (keys == NULL || bases == NULL) : key == NULL)))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s (cuda): bad arguments ([%lld, %lld], dst %p)", what,
                     (long long)rows, (long long)cols,
                     static_cast<void *>(dst));
  const int64_t total = rows * cols;
  if (total == 0)
    return REFIT_OK;
  const refit_synth_key_t one = by_rows ? refit_synth_key_t{} : *key;
  int64_t blocks = (total + 8 * kThreads - 1) / (8 * kThreads);
  if (by_rows) {
    static const int64_t fill =
        refit_cuda_filling_grid(refit_dp_synth_kernel<true>, kThreads);
    blocks = blocks < fill ? blocks : fill;
    refit_dp_synth_kernel<true><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        one, tensor_cols, row0, col0, keys, bases, cols, total, dst);
  } else {
    static const int64_t fill =
        refit_cuda_filling_grid(refit_dp_synth_kernel<false>, kThreads);
    blocks = blocks < fill ? blocks : fill;
    refit_dp_synth_kernel<false><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        one, tensor_cols, row0, col0, keys, bases, cols, total, dst);
  }
  return refit_cuda_launch_check(what);
}

/* Differences of one 16-byte unit at element index i0 (elements of `elem`). */
__device__ inline void compare_unit(uint4 x, uint4 y, int elem, int64_t i0,
                                    int64_t &count, int64_t &first) {
  const uint32_t a[4] = {x.x, x.y, x.z, x.w}, b[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
  for (int w = 0; w < 4; w++) {
    const uint32_t diff = a[w] ^ b[w];
    if (diff == 0)
      continue;
    const int per = 4 / elem;
    for (int k = 0; k < per; k++) {
      const uint32_t mask = elem == 1 ? 0xffu : elem == 2 ? 0xffffu : 0xffffffffu;
      if ((diff >> (8 * elem * k)) & mask) {
        const int64_t idx = i0 + w * per + k;
        first = idx < first ? idx : first;
        count++;
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    refit_dp_compare_kernel(const uint8_t *a, const uint8_t *b, int64_t bytes,
                            int elem, int64_t *count_out, int64_t *first_out) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  int64_t count = 0, first = INT64_MAX, done = 0;
  if (reinterpret_cast<uintptr_t>(a) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(b) % 16 == 0) {
    const uint4 *va = reinterpret_cast<const uint4 *>(a),
                *vb = reinterpret_cast<const uint4 *>(b);
    const int64_t nv = bytes / 16;
    for (int64_t v = tid; v < nv; v += step)
      compare_unit(va[v], vb[v], elem, v * (16 / elem), count, first);
    done = nv * 16;
  }
  for (int64_t i = done / elem + tid; i < bytes / elem; i += step) {
    bool differ = false;
    for (int j = 0; j < elem; j++)
      differ = differ || a[i * elem + j] != b[i * elem + j];
    if (differ) {
      count++;
      first = i < first ? i : first;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    count += __shfl_xor_sync(kFull, count, o);
    const int64_t f = __shfl_xor_sync(kFull, first, o);
    first = f < first ? f : first;
  }
  if (threadIdx.x % 32 == 0 && count > 0) {
    atomicAdd(reinterpret_cast<unsigned long long *>(count_out),
              static_cast<unsigned long long>(count));
    atomicMin(reinterpret_cast<long long *>(first_out),
              static_cast<long long>(first));
  }
}

} // namespace

extern "C" refit_status_t refit_synth_rect_cuda(const refit_synth_key_t *key,
                                                int64_t tensor_cols, int64_t row0,
                                                int64_t col0, int64_t rows, int64_t cols,
                                                uint16_t *dst, cudaStream_t stream) {
  return launch_synth(false, key, tensor_cols, row0, col0, NULL, NULL, rows, cols, dst,
                      stream);
}

extern "C" refit_status_t refit_synth_rows_cuda(const refit_synth_key_t *keys,
                                                const int64_t *bases, int64_t rows,
                                                int64_t cols, uint16_t *dst,
                                                cudaStream_t stream) {
  return launch_synth(true, NULL, 0, 0, 0, keys, bases, rows, cols, dst, stream);
}

extern "C" refit_status_t refit_compare_cuda(const void *a, const void *b,
                                             size_t bytes, size_t elem,
                                             int64_t *count_device,
                                             int64_t *first_device,
                                             cudaStream_t stream) {
  REFIT_CHECK(refit_compare_check(bytes, elem));
  if (bytes == 0)
    return REFIT_OK;
  if (a == NULL || b == NULL || count_device == NULL || first_device == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "compare (cuda): NULL pointer");
  static const int64_t fill =
      refit_cuda_filling_grid(refit_dp_compare_kernel, kThreads);
  const int64_t units = static_cast<int64_t>(bytes / 16) + 1;
  int64_t blocks = (units + kThreads - 1) / kThreads;
  blocks = blocks < fill ? blocks : fill;
  refit_dp_compare_kernel<<<static_cast<unsigned>(blocks), kThreads, 0,
                            stream>>>(
      static_cast<const uint8_t *>(a), static_cast<const uint8_t *>(b),
      static_cast<int64_t>(bytes), static_cast<int>(elem), count_device,
      first_device);
  return refit_cuda_launch_check("compare");
}

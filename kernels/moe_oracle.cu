/*
 * TRTLLM-gen MoE layout on the GPU computed expert by expert, one step of the
 * layout contract at a time (section 5): the device twin of kernels/moe_oracle.c
 * and the GPU benchmark's straightforward per-expert baseline. Like the C
 * oracle it shares nothing with the batched kernels of layout.cu and keeps
 * its intermediates in memory: per expert, the gate/up swap is two device
 * copies, the interleave and the epilogue-tile shuffle are one row-copy
 * kernel each (the shuffle scatters rows with dst32 instead of gathering with
 * src32), and the scale swizzle zeroes the padded matrix and then scatters
 * every scale byte to its offset. That is 16 operations per expert of a gated
 * layer (10 for w13, 6 for w2).
 *
 * Kernel refit_kernels_oracle_rows_kernel
 *   computes  interleave: out row t = in row (t even ? t/2 : m/2 + t/2);
 *             shuffle:    out row dst32(t) = in row t
 *   layout    in, out [m, w] bytes: one matrix of one expert
 *   mapping   one thread per 16-byte unit (per byte when w % 16 != 0 or a
 *             base is not 16-byte aligned), flat over the m * units of the
 *             matrix
 *
 * Kernel refit_kernels_oracle_swizzle_kernel
 *   computes  sw[swizzle_offset(r, c, kp)] = rows[r][c] for every scale byte
 *   layout    rows [m, cols] bytes; sw one swizzled matrix of
 *             round_up(m, 128) * kp bytes, zeroed before the launch
 *   mapping   one thread per input byte
 */
#include "kernels/cuda_launch.cuh"
#include "kernels/mxfp8_cuda.h"

namespace {

constexpr int kThreads = 256;

enum oracle_step { kInterleave = 0, kShuffle = 1 };

template <typename V>
__global__ void refit_kernels_oracle_rows_kernel(const V *in, int64_t m, int64_t units,
                                                 int step, V *out) {
  const int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (u >= m * units)
    return;
  const int64_t t = u / units, i = u % units;
  if (step == kInterleave)
    out[t * units + i] = in[(t % 2 == 0 ? t / 2 : m / 2 + t / 2) * units + i];
  else
    out[refit_kernels_perm_index(REFIT_KERNELS_PERM_DST32, m, t) * units + i] =
        in[t * units + i];
}

__global__ void refit_kernels_oracle_swizzle_kernel(const uint8_t *rows, int64_t m,
                                                    int64_t cols, int64_t kp,
                                                    uint8_t *sw) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= m * cols)
    return;
  sw[refit_kernels_swizzle_offset(b / cols, b % cols, kp)] = rows[b];
}

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>((n + kThreads - 1) / kThreads);
}

/* Interleave or shuffle one [m, w] matrix in -> out. */
refit_status_t oracle_step_run(const uint8_t *in, int64_t m, int64_t w, int step,
                               uint8_t *out, cudaStream_t stream) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(in) | reinterpret_cast<uintptr_t>(out);
  if (w % 16 == 0 && a % 16 == 0)
    refit_kernels_oracle_rows_kernel<uint4>
        <<<blocks_for(m * w / 16), kThreads, 0, stream>>>(
            reinterpret_cast<const uint4 *>(in), m, w / 16, step,
            reinterpret_cast<uint4 *>(out));
  else
    refit_kernels_oracle_rows_kernel<uint8_t>
        <<<blocks_for(m * w), kThreads, 0, stream>>>(in, m, w, step, out);
  return refit_cuda_launch_check(step == kInterleave ? "moe oracle interleave"
                                                     : "moe oracle shuffle");
}

refit_status_t oracle_copy(uint8_t *dst, const uint8_t *src, int64_t n,
                           cudaStream_t stream) {
  const cudaError_t err =
      cudaMemcpyAsync(dst, src, static_cast<size_t>(n), cudaMemcpyDeviceToDevice, stream);
  if (err != cudaSuccess)
    return REFIT_ERR(REFIT_ERR_CUDA, "moe oracle (cuda): copy of %lld bytes failed: %s",
                     (long long)n, cudaGetErrorString(err));
  return REFIT_OK;
}

/* Steps 1-3 on one matrix [m, w] (values: w = K; scales: w = K/32). */
refit_status_t oracle_rows(const uint8_t *in, int64_t m, int64_t w, int gated,
                           uint8_t *tmp, uint8_t *out, cudaStream_t stream) {
  if (gated) {
    /* 1. swap [gate; up] -> [up; gate]; 2. interleave: row 2i <- i,
     * row 2i+1 <- m/2 + i. */
    REFIT_CHECK(oracle_copy(out, in + (m / 2) * w, (m / 2) * w, stream));
    REFIT_CHECK(oracle_copy(out + (m / 2) * w, in, (m / 2) * w, stream));
    REFIT_CHECK(oracle_step_run(out, m, w, kInterleave, tmp, stream));
  } else {
    REFIT_CHECK(oracle_copy(tmp, in, m * w, stream));
  }
  /* 3. epilogue-tile shuffle: input row r goes to output row dst32(r). */
  return oracle_step_run(tmp, m, w, kShuffle, out, stream);
}

/* Scratch of one tensor: tmp (m * k, 16-byte rounded) then the scale rows. */
int64_t oracle_tensor_scratch(int64_t m, int64_t k) {
  return refit_round_up(m * k, 16) + m * (k / 32);
}

/* One tensor (w13 or w2) of every expert. */
refit_status_t oracle_tensor(int64_t E, int64_t m, int64_t k, int gated,
                             const uint8_t *values, const uint8_t *scales,
                             uint8_t *values_out, uint8_t *scales_out, uint8_t *scratch,
                             cudaStream_t stream) {
  const int64_t cols = k / 32, kp = refit_round_up(cols, 4);
  const int64_t mpad = refit_round_up(m, 128);
  uint8_t *tmp = scratch, *srows = scratch + refit_round_up(m * k, 16);
  for (int64_t e = 0; e < E; e++) {
    REFIT_CHECK(oracle_rows(values + e * m * k, m, k, gated, tmp, values_out + e * m * k,
                            stream));
    REFIT_CHECK(oracle_rows(scales + e * m * cols, m, cols, gated, tmp, srows, stream));
    /* 4. pad to [mpad, kp] with zeros and 5. swizzle by the offset formula. */
    uint8_t *sw = scales_out + e * mpad * kp;
    const cudaError_t err =
        cudaMemsetAsync(sw, 0, static_cast<size_t>(mpad * kp), stream);
    if (err != cudaSuccess)
      return REFIT_ERR(REFIT_ERR_CUDA,
                       "moe oracle (cuda): zeroing expert %lld failed: %s", (long long)e,
                       cudaGetErrorString(err));
    refit_kernels_oracle_swizzle_kernel<<<blocks_for(m * cols), kThreads, 0, stream>>>(
        srows, m, cols, kp, sw);
    REFIT_CHECK(refit_cuda_launch_check("moe oracle swizzle"));
  }
  return REFIT_OK;
}

} // namespace

extern "C" int64_t
refit_kernels_moe_oracle_scratch_bytes(const refit_kernels_moe_shape_t *s) {
  const int64_t m13 = s->gated ? 2 * s->intermediate : s->intermediate;
  const int64_t a = oracle_tensor_scratch(m13, s->hidden);
  const int64_t b = oracle_tensor_scratch(s->hidden, s->intermediate);
  return a > b ? a : b;
}

extern "C" refit_status_t refit_kernels_moe_transform_oracle_cuda(
    const refit_kernels_moe_shape_t *s, const uint8_t *w13, const uint8_t *w13_scale,
    const uint8_t *w2, const uint8_t *w2_scale, uint8_t *w13_out, uint8_t *w13_scale_out,
    uint8_t *w2_out, uint8_t *w2_scale_out, uint8_t *scratch, int64_t scratch_bytes,
    cudaStream_t stream) {
  REFIT_CHECK(refit_kernels_moe_check_shape(s, "oracle (cuda)", NULL));
  if (w13 == NULL || w13_scale == NULL || w2 == NULL || w2_scale == NULL ||
      w13_out == NULL || w13_scale_out == NULL || w2_out == NULL ||
      w2_scale_out == NULL || scratch == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "moe oracle (cuda): NULL buffer");
  const int64_t need = refit_kernels_moe_oracle_scratch_bytes(s);
  if (scratch_bytes < need)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "moe oracle (cuda): scratch of %lld bytes, the shape needs %lld",
                     (long long)scratch_bytes, (long long)need);
  const int64_t m13 = s->gated ? 2 * s->intermediate : s->intermediate;
  REFIT_CHECK(oracle_tensor(s->num_experts, m13, s->hidden, s->gated, w13, w13_scale,
                            w13_out, w13_scale_out, scratch, stream));
  return oracle_tensor(s->num_experts, s->hidden, s->intermediate, 0, w2, w2_scale,
                       w2_out, w2_scale_out, scratch, stream);
}

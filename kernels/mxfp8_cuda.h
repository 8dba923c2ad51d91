/*
 * CUDA twins of the C reference kernels (kernels/mxfp8.h, kernels/layout.h).
 *
 * Same arguments, same rules, same bytes: every function here writes exactly
 * what its C twin writes (tests/kernels/test_kernels_cuda.c holds them equal
 * byte for byte). All pointers are device pointers; work is enqueued on
 * `stream` and the call returns without waiting. Shape errors are reported
 * before anything is enqueued, with the C twin's message and status; a failed
 * launch returns REFIT_ERR_CUDA naming the kernel and the CUDA error.
 *
 * Alignment: buffers from cudaMalloc (and offsets that are multiples of 16
 * bytes) take the vectorized paths; any other alignment is still correct.
 * The layout kernels compute permutations from the formula in registers
 * instead of reading the host cache: a few integer ops are cheaper than a
 * load, and there is no device-side cache to keep alive.
 *
 * Only this header needs CUDA headers; C code that includes it must be built
 * with the CUDA include path (target refit_kernels_cuda carries it).
 */
#ifndef REFIT_KERNELS_MXFP8_CUDA_H
#define REFIT_KERNELS_MXFP8_CUDA_H

#include "kernels/layout.h"
#include "kernels/mxfp8.h"

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* refit_mxfp8_quantize_rows on the device. */
refit_status_t refit_mxfp8_quantize_rows_cuda(const uint16_t *src, int64_t rows,
                                              int64_t k, int64_t src_stride_elems,
                                              uint8_t *q, int64_t q_stride,
                                              uint8_t *scale, int64_t scale_stride,
                                              cudaStream_t stream);

/* refit_kernels_scale_swizzle on the device. */
refit_status_t refit_kernels_scale_swizzle_cuda(const uint8_t *lin, int64_t num,
                                                int64_t rows, int64_t cols,
                                                uint8_t *out,
                                                cudaStream_t stream);

/* refit_kernels_moe_transform_tensor on the device (two kernels). */
refit_status_t refit_kernels_moe_transform_tensor_cuda(
    const refit_kernels_moe_shape_t *s, refit_kernels_moe_tensor_t which,
    const uint8_t *values, const uint8_t *scales, uint8_t *values_out,
    uint8_t *scales_out, cudaStream_t stream);

/* refit_kernels_nvfp4_moe_transform on the device (two kernels). */
refit_status_t refit_kernels_nvfp4_moe_transform_cuda(
    refit_kernels_moe_backend_t backend, const refit_kernels_moe_shape_t *s,
    refit_kernels_moe_tensor_t which, const uint8_t *packed, const uint8_t *lin,
    uint8_t *w_out, uint8_t *s_out, cudaStream_t stream);

/* refit_kernels_moe_transform on the device (four kernels). */
refit_status_t refit_kernels_moe_transform_cuda(
    const refit_kernels_moe_shape_t *s, const uint8_t *w13,
    const uint8_t *w13_scale, const uint8_t *w2, const uint8_t *w2_scale,
    uint8_t *w13_out, uint8_t *w13_scale_out, uint8_t *w2_out,
    uint8_t *w2_scale_out, cudaStream_t stream);

/*
 * refit_kernels_moe_transform_oracle on the device (kernels/moe_oracle.cu):
 * the same bytes as refit_kernels_moe_transform_cuda, computed expert by
 * expert and step by step with its intermediates in `scratch`, a device
 * buffer of at least refit_kernels_moe_oracle_scratch_bytes(s) bytes. It
 * enqueues 16 copies, fills and kernels per expert of a gated layer: the test
 * oracle and the benchmark's straightforward baseline, not a production path.
 * Errors: shape rules, NULL buffers, scratch too small (its size named).
 */
refit_status_t refit_kernels_moe_transform_oracle_cuda(
    const refit_kernels_moe_shape_t *s, const uint8_t *w13,
    const uint8_t *w13_scale, const uint8_t *w2, const uint8_t *w2_scale,
    uint8_t *w13_out, uint8_t *w13_scale_out, uint8_t *w2_out,
    uint8_t *w2_scale_out, uint8_t *scratch, int64_t scratch_bytes,
    cudaStream_t stream);

/* Scratch bytes of the oracle above for a shape that passes
 * refit_kernels_moe_check_shape. */
int64_t refit_kernels_moe_oracle_scratch_bytes(const refit_kernels_moe_shape_t *s);

/* refit_kernels_dense_transform on the device. */
refit_status_t refit_kernels_dense_transform_cuda(
    refit_kernels_dense_backend_t backend, int64_t n, int64_t k,
    const uint8_t *q, const uint8_t *scale, uint8_t *weight_out,
    uint8_t *scale_out, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_KERNELS_MXFP8_CUDA_H */

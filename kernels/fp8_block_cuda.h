/*
 * CUDA twin of the block FP8 C reference (kernels/fp8_block.h): same
 * arguments, same rules, same bytes. All pointers are device pointers; work
 * is enqueued on `stream` and the call returns without waiting. Argument
 * errors are reported before anything is enqueued, with the C twin's rule
 * (refit_fp8_block_check); a failed launch returns REFIT_ERR_CUDA.
 *
 * Only this header needs CUDA headers; C code that includes it must be built
 * with the CUDA include path (target refit_kernels_cuda carries it).
 */
#ifndef REFIT_KERNELS_FP8_BLOCK_CUDA_H
#define REFIT_KERNELS_FP8_BLOCK_CUDA_H

#include "kernels/fp8_block.h"

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* refit_fp8_block_quantize on the device. */
refit_status_t refit_fp8_block_quantize_cuda(const uint16_t *src, int64_t rows, int64_t k,
                                             int64_t src_stride_elems,
                                             refit_fp8_scale_t mode, uint8_t *q,
                                             int64_t q_stride, float *scale_inv,
                                             int64_t scale_stride, cudaStream_t stream);

/* refit_fp8_block_dequantize on the device. */
refit_status_t refit_fp8_block_dequantize_cuda(const uint8_t *q, int64_t rows, int64_t k,
                                               int64_t q_stride, const float *scale_inv,
                                               int64_t scale_stride, uint16_t *out,
                                               int64_t out_stride_elems,
                                               cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_KERNELS_FP8_BLOCK_CUDA_H */

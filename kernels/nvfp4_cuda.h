/*
 * CUDA twin of the NVFP4 C reference (kernels/nvfp4.h): same arguments, same
 * rules, same bytes. All pointers are device pointers; work is enqueued on
 * `stream` and the call returns without waiting. Argument errors are
 * reported before anything is enqueued, with the C twin's rule
 * (refit_nvfp4_check); a failed launch returns REFIT_ERR_CUDA.
 *
 * Only this header needs CUDA headers; C code that includes it must be built
 * with the CUDA include path (target refit_kernels_cuda carries it).
 */
#ifndef REFIT_KERNELS_NVFP4_CUDA_H
#define REFIT_KERNELS_NVFP4_CUDA_H

#include "kernels/nvfp4.h"

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* refit_nvfp4_quantize on the device. */
refit_status_t refit_nvfp4_quantize_cuda(const uint16_t *src, int64_t rows, int64_t k,
                                         int64_t src_stride_elems, float gsf, uint8_t *q,
                                         int64_t q_stride, uint8_t *sf, int64_t sf_stride,
                                         cudaStream_t stream);

/* refit_nvfp4_quantize_groups on the device (gsf a host array, decode device
 * memory or NULL): one launch per 256 matrices, their rules and decode
 * scales carried in its parameters. */
refit_status_t
refit_nvfp4_quantize_groups_cuda(const uint16_t *src, int64_t groups, int64_t rows,
                                 int64_t k, int64_t src_stride_elems, const float *gsf,
                                 uint8_t *q, int64_t q_stride, uint8_t *sf,
                                 int64_t sf_stride, float *decode, cudaStream_t stream);

/* refit_nvfp4_amax_key on the device, merged into one uint32 of device
 * memory: *key = max(*key, the matrix's key). Many matrices (a tensor's
 * shards, its row runs) can merge into one slot before a single read-back. */
refit_status_t refit_nvfp4_amax_key_cuda(const uint16_t *src, int64_t rows, int64_t k,
                                         int64_t src_stride_elems, uint32_t *key,
                                         cudaStream_t stream);

/* refit_nvfp4_amax_keys on the device, one launch: descs_device is the
 * device copy of a table numbered by refit_nvfp4_amax_number (which returned
 * `tiles`); each tile's key merges into its descriptor's slot (device
 * memory) by one atomicMax. */
refit_status_t refit_nvfp4_amax_keys_cuda(const refit_nvfp4_amax_desc_t *descs_device,
                                          int64_t n, int64_t tiles, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_KERNELS_NVFP4_CUDA_H */

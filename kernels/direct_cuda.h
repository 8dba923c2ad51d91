/*
 * CUDA twin of the zero-copy data path (kernels/direct.h): same descriptors,
 * same bytes. Every pointer is a device pointer (the descriptor table too;
 * check it on the host with refit_direct_descs_check before uploading: the
 * device skips a descriptor it cannot execute safely and cannot report it).
 * Work is enqueued on `stream`; the call returns without waiting.
 *
 * Cost: two kernels over the table's work (the quantizing descriptors, and
 * the rest), cut into equal warp tiles numbered across the whole table (512
 * MXFP8 blocks; 2048 16-byte units of a DIGEST whose rows are whole aligned
 * units, else 1024 words), then a kernel with a thread per descriptor that
 * writes (DIGEST) or checks (COPY, QUANTIZE) the sealed digests. QUANTIZE
 * reads each BF16 word once and sums the digest from the registers it
 * quantizes; its stores are 8 bytes per lane at the row's final place, its
 * scale bytes single stores at their swizzled places.
 */
#ifndef REFIT_KERNELS_DIRECT_CUDA_H
#define REFIT_KERNELS_DIRECT_CUDA_H

#include "kernels/direct.h"

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * refit_direct_rows on the device. acc_device: n 8-byte accumulators of the
 * caller's (zeroed here, on the stream). *bad_chunk_device (set to -1 by the
 * caller) becomes the smallest index of a COPY or QUANTIZE descriptor whose
 * digest did not match.
 */
refit_status_t refit_direct_rows_cuda(const refit_direct_desc_t *descs_device, int64_t n,
                                      uint64_t tag, void *digests_device,
                                      unsigned long long *acc_device,
                                      int64_t *bad_chunk_device, cudaStream_t stream);

/*
 * The values and scales of the BLOCK_QUANTIZE descriptors among [0, n) of a
 * table numbered by refit_direct_number_blocks, given as its host copy (the
 * range's blocks are counted there) and its device copy (the kernel reads
 * it): one launch, a thread block per 128 x 128 block, which finds its
 * descriptor by block0, on `stream`. Their digests are checked by
 * refit_direct_rows_cuda over the same table. Errors: a bad table.
 */
refit_status_t refit_direct_blocks_cuda(const refit_direct_desc_t *descs_host,
                                        const refit_direct_desc_t *descs_device,
                                        int64_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_KERNELS_DIRECT_CUDA_H */

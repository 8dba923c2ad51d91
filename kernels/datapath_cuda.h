/*
 * CUDA twins of the data-path kernels (kernels/datapath.h): same descriptors,
 * same bytes. All pointers are device pointers, descriptor tables included
 * (the runtime uploads each bucket's table once, after
 * refit_{pack,land}_descs_check on the host copy, and replays it). Work is
 * enqueued on `stream`; calls return without waiting and are safe to capture
 * in a CUDA graph.
 *
 * Since the tables live in device memory, these functions cannot report a bad
 * descriptor; one the device cannot execute safely (bad op, cols % 32 for a
 * quantizing op, inconsistent row_bytes) is skipped. Check tables on the host.
 *
 * Cost: each call is one kernel over all descriptors' work (plus a small
 * kernel with a thread per descriptor that writes (pack) or checks (land) the
 * digests, a pack digest pass when a digest could not be fused, and a
 * scratch array of 8 bytes per descriptor from a private stream-ordered memory
 * pool).
 * Work is split into equal tiles (8 KiB of copy, or 32 quantized blocks, per
 * warp) numbered across the whole table, so one large chunk and many small
 * ones spread evenly over the GPU.
 *
 * Alignment: any alignment is correct. Copies run 16 bytes at a time where
 * source and destination have the same address modulo 16 (8, 4, 2 bytes at a
 * time for weaker common alignment); chunk offsets that are multiples of 16
 * are the fast case. Digests are summed from the registers being copied when
 * the wire chunk, its rows and the other side's rows are 16- or 8-byte
 * aligned (land QUANTIZE: always); else the wire bytes are read a second time
 * (pack: by a second kernel; land: by extra tiles of the same kernel).
 */
#ifndef REFIT_KERNELS_DATAPATH_CUDA_H
#define REFIT_KERNELS_DATAPATH_CUDA_H

#include "kernels/datapath.h"

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* refit_pack_rows on the device: n descriptors at descs_device into buf.
 * BLOCK_QUANTIZE descriptors are only sealed here (their digests read from
 * the wire): refit_pack_blocks_cuda writes their rows first. */
refit_status_t refit_pack_rows_cuda(const refit_pack_desc_t *descs_device,
                                    int64_t n, uint64_t tag, void *buf,
                                    cudaStream_t stream);

/*
 * The wire rows of the BLOCK_QUANTIZE descriptors among descs_host[0 .. n)
 * (host memory; src and buf device memory), stream-ordered before
 * refit_pack_rows_cuda of the same descriptors: each chunk through the CUDA
 * twin of the block FP8 quantizer (refit_fp8_block_quantize_cuda: values
 * straight into the wire rows, scales into a pooled scratch), then its scales
 * into the slots of its block rows' first rows and zeros into the others.
 * Host-driven (a few launches per such chunk). Errors: a bad table
 * (refit_pack_descs_check), CUDA errors.
 */
refit_status_t refit_pack_blocks_cuda(const refit_pack_desc_t *descs_host, int64_t n,
                                      void *buf, cudaStream_t stream);

/*
 * refit_land_rows on the device, in one pass over the staging area: every
 * chunk lands, its digest summed from the bytes read to land it. Then
 * *bad_chunk_device (device memory, set to -1 by the caller before the call)
 * becomes the smallest index of a descriptor whose digest did not match; such
 * chunks have landed all the same, the same bytes as refit_land_rows (the
 * caller discards the refit: see refit_land_desc_t in kernels/datapath.h).
 */
refit_status_t refit_land_rows_cuda(const refit_land_desc_t *descs_device,
                                    int64_t n, uint64_t tag, const void *staging,
                                    int64_t *bad_chunk_device,
                                    cudaStream_t stream);

/* refit_synth_rect on the device (key: host memory; dst: rows x cols uint16
 * in device memory). */
refit_status_t refit_synth_rect_cuda(const refit_synth_key_t *key, int64_t tensor_cols,
                                     int64_t row0, int64_t col0, int64_t rows,
                                     int64_t cols, uint16_t *dst, cudaStream_t stream);

/* refit_synth_rows on the device (keys, bases: `rows` entries each, in
 * device memory). */
refit_status_t refit_synth_rows_cuda(const refit_synth_key_t *keys, const int64_t *bases,
                                     int64_t rows, int64_t cols, uint16_t *dst,
                                     cudaStream_t stream);

/*
 * refit_compare on the device, accumulating: *count_device += the number of
 * differing elements, *first_device = min(itself, first differing index). The
 * caller initializes them (0 and INT64_MAX) and may compare several buffers
 * into one pair.
 */
refit_status_t refit_compare_cuda(const void *a, const void *b, size_t bytes,
                                  size_t elem, int64_t *count_device,
                                  int64_t *first_device, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_KERNELS_DATAPATH_CUDA_H */

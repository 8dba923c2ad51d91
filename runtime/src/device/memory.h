/*
 * Where a rank's refit memory lives, and the data-path operations on it.
 *
 * A session runs either on host memory (the C reference kernels) or on the
 * memory of the GPU the rank is bound to (their CUDA twins, same bytes). This
 * is the one place that chooses: the loader and the session call refit_mem_*
 * and never test for CUDA themselves. Device work is queued on one stream per
 * rank, in order; refit_mem_sync waits for it.
 */
#ifndef REFIT_MEMORY_H
#define REFIT_MEMORY_H

#include "kernels/datapath.h"
#include "kernels/direct.h"
#include "kernels/layout.h"
#include "kernels/nvfp4.h"
#include "kernels/place.h"
#include "refit/status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct refit_mem refit_mem_t;

/* Host memory, or device memory of the GPU this rank binds to (collective
 * over the job when `device` is set: the binding needs node-local ranks). */
refit_status_t refit_mem_create(int device, refit_mem_t **out);
void refit_mem_destroy(refit_mem_t *m);

/* 1 when this rank's refit memory is device memory. */
int refit_mem_on_device(const refit_mem_t *m);

/*
 * Ordering with a caller's CUDA stream (a cudaStream_t; NULL is the legacy
 * default stream), the way NCCL orders with the stream it is given. After
 * refit_mem_after_stream, work refit queues runs only once everything queued
 * on `stream` so far is done; after refit_mem_before_stream, work queued on
 * `stream` from then on runs only once everything refit queued so far is
 * done. Neither blocks the host. Host memory: nothing to order.
 */
refit_status_t refit_mem_after_stream(refit_mem_t *m, void *stream);
refit_status_t refit_mem_before_stream(refit_mem_t *m, void *stream);

/* The CUDA device ordinal of this rank's memory, -1 for host memory. */
int refit_mem_device_ordinal(const refit_mem_t *m);

/* How many GPUs this process sees (0 without CUDA or a driver). */
int refit_mem_gpu_count(void);

refit_status_t refit_mem_alloc(refit_mem_t *m, size_t bytes, void **ptr);

/* As refit_mem_alloc; on a device, memory another process of the node maps
 * at full speed where the driver can make it (device_share.h; cudaMalloc
 * otherwise): for the trainer tensors that generators read in place under
 * zero copy. */
refit_status_t refit_mem_alloc_shared(refit_mem_t *m, size_t bytes, void **ptr);

/* Is `ptr` memory this rank's kernels can use (host memory for a host
 * session, memory of the rank's GPU for a device session)? */
int refit_mem_usable(refit_mem_t *m, const void *ptr);
void refit_mem_free(refit_mem_t *m, void *ptr);

/* Queue a copy / a fill (dst, src in this rank's memory). */
refit_status_t refit_mem_copy(refit_mem_t *m, void *dst, const void *src,
                              size_t bytes);
refit_status_t refit_mem_zero(refit_mem_t *m, void *dst, size_t bytes);
/* Copy between this rank's memory and host memory, synchronously. */
refit_status_t refit_mem_to_host(refit_mem_t *m, void *host, const void *src,
                                 size_t bytes);
refit_status_t refit_mem_from_host(refit_mem_t *m, void *dst, const void *host,
                                   size_t bytes);

/* Wait for everything queued so far. */
refit_status_t refit_mem_sync(refit_mem_t *m);
/* Has everything queued so far finished? (Never blocks; host: always.) */
refit_status_t refit_mem_done(refit_mem_t *m, int *done);

/*
 * A descriptor table that lives where the kernels read it: built on the host
 * once, uploaded once, replayed every refit. `host` stays valid (the loader
 * edits nothing in it afterwards).
 */
typedef struct {
  void *host;
  void *device; /* NULL on host memory */
  int64_t count;
} refit_mem_table_t;

refit_status_t refit_mem_table_upload(refit_mem_t *m, refit_mem_table_t *t,
                                      size_t elem_bytes);
void refit_mem_table_free(refit_mem_t *m, refit_mem_table_t *t);
/* Copy an uploaded table's host entries to its device copy again (after the
 * host entries changed: a trainer tensor registered at a new address). */
refit_status_t refit_mem_table_refresh(refit_mem_t *m, refit_mem_table_t *t,
                                       size_t elem_bytes);

/* Pack descriptors [first, first + n) of `t` into `buf`, digests sealed
 * with `tag` (core/digest.h). */
refit_status_t refit_mem_pack(refit_mem_t *m, const refit_mem_table_t *t,
                              int64_t first, int64_t n, uint64_t tag, void *buf);

/*
 * Landing a bucket as several runs of descriptors without waiting between
 * them: reserve room for `runs` results once, queue each run with its index
 * (digests checked sealed with `tag`), then collect: *bad_chunk is the table
 * index of the first chunk (in run order) whose digest failed, or -1. Collect waits for the queued work.
 */
refit_status_t refit_mem_land_reserve(refit_mem_t *m, int64_t runs);
refit_status_t refit_mem_land_run(refit_mem_t *m, const refit_mem_table_t *t,
                                  int64_t first, int64_t n, uint64_t tag,
                                  const void *staging, int64_t run);
refit_status_t refit_mem_land_collect(refit_mem_t *m, int64_t runs,
                                      int64_t *bad_chunk);

/*
 * Zero-copy descriptors [first, first + n) of `t` (kernels/direct.h), digests
 * sealed with `tag` in `digests` (this rank's memory). acc: n 8-byte
 * accumulators in this rank's memory (unused on the host). With run >= 0 the
 * run's first bad chunk is collected by refit_mem_land_collect like a land
 * run's (reserve the runs first); with run < 0 nothing is checked (the
 * trainer's DIGEST table).
 */
refit_status_t refit_mem_direct_run(refit_mem_t *m, const refit_mem_table_t *t,
                                    int64_t first, int64_t n, uint64_t tag, void *digests,
                                    void *acc, int64_t run);

/* The layout kernels (kernels/layout.h) on this rank's memory. */
refit_status_t refit_mem_quantize_rows(refit_mem_t *m, const uint16_t *src,
                                       int64_t rows, int64_t k, uint8_t *q,
                                       uint8_t *scale);
/* Block FP8 (kernels/fp8_block.h) of a [rows, k] BF16 matrix, row strides
 * in elements (src, q) and in FP32 scales (scale_inv). */
refit_status_t refit_mem_fp8_block_quantize(refit_mem_t *m, const uint16_t *src,
                                            int64_t rows, int64_t k, int64_t src_stride,
                                            int mode, uint8_t *q, int64_t q_stride,
                                            float *scale_inv, int64_t scale_stride);
/* Block FP8 -> BF16 as vLLM's scaled_dequantize (kernels/fp8_block.h), on
 * the device or the host as m is. */
refit_status_t refit_mem_fp8_block_dequantize(refit_mem_t *m, const uint8_t *q,
                                              int64_t rows, int64_t k, int64_t q_stride,
                                              const float *scale_inv, int64_t scale_stride,
                                              uint16_t *out, int64_t out_stride);
/* NVFP4 (kernels/nvfp4.h) of `groups` contiguous [rows, k] BF16 matrices
 * stacked as one, matrix g under global scale gsf[g] (host memory): packed
 * E2M1 q [groups * rows, ceil(k/2)], linear E4M3 scales sf [groups * rows,
 * ceil(k/16)] and the decode scales decode[groups] (this rank's memory),
 * each fl(1 / gsf[g]); on a device one launch per 256 matrices, no copy. */
refit_status_t refit_mem_nvfp4_quantize(refit_mem_t *m, const uint16_t *src,
                                        int64_t groups, int64_t rows, int64_t k,
                                        const float *gsf, uint8_t *q, uint8_t *sf,
                                        float *decode);
/* kernels/layout.h's 128x4 swizzle of num linear scale matrices [rows, cols]. */
refit_status_t refit_mem_scale_swizzle(refit_mem_t *m, const uint8_t *lin, int64_t num,
                                       int64_t rows, int64_t cols, uint8_t *out);
/* Merge the NVFP4 amax keys of many BF16 matrices, each into its slot
 * (refit_nvfp4_amax_keys: *slot = max(*slot, key)); slots are uint32 of
 * this rank's memory (refit_mem_alloc). The table is host memory, numbered
 * here; on a device it is uploaded and one kernel reads every matrix
 * (refit_nvfp4_amax_keys_cuda), and the call returns when the keys are in
 * their slots. */
refit_status_t refit_mem_amax_merge(refit_mem_t *m, refit_nvfp4_amax_desc_t *descs,
                                    int64_t n);
refit_status_t refit_mem_dense_transform(refit_mem_t *m,
                                         refit_kernels_dense_backend_t backend,
                                         int64_t n, int64_t k, const uint8_t *q,
                                         const uint8_t *scale, uint8_t *w_out,
                                         uint8_t *s_out);
refit_status_t refit_mem_moe_transform(refit_mem_t *m,
                                       const refit_kernels_moe_shape_t *shape,
                                       refit_kernels_moe_tensor_t which,
                                       const uint8_t *q, const uint8_t *scale,
                                       uint8_t *w_out, uint8_t *s_out);
/* An NVFP4 expert tensor (packed E2M1 and linear E4M3 scales of every
 * expert) into `backend`'s layout (refit_kernels_nvfp4_moe_transform). */
refit_status_t refit_mem_nvfp4_moe_transform(refit_mem_t *m,
                                             refit_kernels_moe_backend_t backend,
                                             const refit_kernels_moe_shape_t *shape,
                                             refit_kernels_moe_tensor_t which,
                                             const uint8_t *packed, const uint8_t *lin,
                                             uint8_t *w_out, uint8_t *s_out);

/* Synthetic weights straight into this rank's memory. */
refit_status_t refit_mem_synth_rect(refit_mem_t *m, const refit_synth_key_t *key,
                                    int64_t tensor_cols, int64_t row0, int64_t col0,
                                    int64_t rows, int64_t cols, uint16_t *dst);
/* keys and bases are host arrays of `rows` entries. */
refit_status_t refit_mem_synth_rows(refit_mem_t *m, const refit_synth_key_t *keys,
                                    const int64_t *bases, int64_t rows, int64_t cols,
                                    uint16_t *dst);

/*
 * The delta codec's encode (kernels/delta.h) on this rank's memory, for
 * delta refits (delta_wire.h). A chunk: its new bytes `now` and its
 * baseline `base`, both `bytes` long, and `off`, where its delta goes in
 * `out` (room for refit_delta_bound(bytes) there); lens[] gets each delta's
 * length. Waits for the work it queues. The table is host memory; the bytes
 * this rank's memory (pinned host memory too on a device).
 */
typedef struct {
  const void *now;
  void *base;
  uint64_t bytes, off;
} refit_mem_delta_t;

refit_status_t refit_mem_delta_encode(refit_mem_t *m, const refit_mem_delta_t *chunks,
                                      int64_t n, void *out, uint64_t *lens);

/* The deltas refit_mem_delta_encode made (at out + off, lens[i] long)
 * applied to the same chunks' `base`, which then holds `now`'s bytes. All
 * are checked (refit_delta_decode's rules) before any is written. Waits
 * for the work it queues (the verdict is read back), as encode does. */
refit_status_t refit_mem_delta_apply(refit_mem_t *m, const refit_mem_delta_t *chunks,
                                     int64_t n, const void *out, const uint64_t *lens);

/*
 * Deltas applied through their places in runtime storage on a GPU
 * (kernels/place_cuda.h; device memory only). check: n chunks (a host
 * table; host_bytes[i] a host copy of chunk i's delta, NULL for a whole
 * span) checked on the device; waits, then outs (host) holds each chunk's
 * results, or *bad_chunk the first bad chunk (-1: none) and the status why.
 * write: right after a check of the same chunks that passed, writes their
 * changed bytes, each logged at undo_at[undo_base + i] and undo_old (device
 * memory) when undo_at is not NULL; waits; outs[i].written, and in
 * *undo_end the log's end (undo_base + the entries taken; some may have
 * address 0, none). undo: restores n logged bytes.
 */
refit_status_t refit_mem_place_check(refit_mem_t *m, const refit_place_cuda_chunk_t *chunks,
                                     const void *const *host_bytes, int64_t n,
                                     refit_place_cuda_out_t *outs, int64_t *bad_chunk);
refit_status_t refit_mem_place_write(refit_mem_t *m, uint64_t *undo_at, uint8_t *undo_old,
                                     uint64_t undo_base, refit_place_cuda_out_t *outs,
                                     uint64_t *undo_end);
refit_status_t refit_mem_place_undo(refit_mem_t *m, const uint64_t *undo_at,
                                    const uint8_t *undo_old, int64_t n);

/* Queue n copies (src, dst, bytes), all sources inside [src_base, src_base +
 * span), in one pass: the pieces of delta frames. */
typedef struct {
  int64_t src_off; /* from src_base */
  void *dst;
  int64_t bytes;
} refit_mem_piece_t;
refit_status_t refit_mem_gather(refit_mem_t *m, const void *src_base,
                                const refit_mem_piece_t *pieces, int64_t n);

/* Pinned host memory that this rank's GPU reads and writes in place (plain
 * host memory on a host session); refit_mem_free_pinned releases it. */
refit_status_t refit_mem_alloc_pinned(refit_mem_t *m, size_t bytes, void **ptr);
void refit_mem_free_pinned(refit_mem_t *m, void *ptr);

/* Count differing elements of a and b (both in this rank's memory); waits. */
refit_status_t refit_mem_compare(refit_mem_t *m, const void *a, const void *b,
                                 size_t bytes, size_t elem, int64_t *count,
                                 int64_t *first);

#endif /* REFIT_MEMORY_H */

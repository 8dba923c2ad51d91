/*
 * CUDA twin of kernels/place.h's delta apply: a batch of chunks' deltas (or
 * whole spans) applied through their places in runtime storage on a GPU, in
 * the same two steps, with the same results: check gives each chunk's changed
 * row bytes, the change of its rows' digest and its new trailer, and finds
 * every error refit_place_delta_check finds; write then writes exactly the
 * bytes refit_place_delta_write writes. Nothing is written before the whole
 * batch is known good: the caller reads the check's results back, checks the
 * digests, and only then queues the write.
 *
 * A call's work is cut into tiles, each of one chunk (a thread block per
 * tile): positions 512 at a time, a mask's blocks 8192 at a time (256 mask
 * words), dense and whole spans 4096 8-byte words at a time (small tiles, so
 * that a sparse batch still spreads over the GPU).
 * refit_place_cuda_tiles makes a chunk's tiles on the host, from a host copy
 * of its delta, and checks there what refit_delta_info checks (the header,
 * the lengths, the mask's count and tail) and the chunk size; the device
 * checks the rest (positions in the span and increasing, the baseline rule
 * of kernels/delta.h against the bytes at their places). A position's digest
 * word is gathered by the thread of the first position in that word, which
 * also reads the (at most 7) positions after it in the same word.
 *
 * Every pointer given to the *_cuda calls is a device pointer, the tables
 * included; the calls enqueue on `stream`, allocate nothing and return
 * without waiting.
 */
#ifndef REFIT_KERNELS_PLACE_CUDA_H
#define REFIT_KERNELS_PLACE_CUDA_H

#include "kernels/delta_cuda.h"
#include "kernels/place.h"

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A tile: items [item0, item0 + items) of chunk `chunk` of the batch. */
typedef struct {
  int64_t chunk;
  int64_t item0, items;
  int64_t data0; /* mask: the marked blocks before mask word item0 */
  int32_t kind;  /* refit_delta_encoding_t; DENSE for a whole span too */
  int32_t pad;
} refit_place_cuda_tile_t;

/* Chunk c's tiles, numbered from index `chunk` of the batch, into tiles
 * (NULL: count only) and their number into *ntiles. `host_bytes` is a host
 * copy of c->bytes (a whole span's may be NULL: only its length counts).
 * c's shape must be a valid refit_place_chunk. Errors: REFIT_ERR_INTEGRITY
 * as refit_place_delta_check gives for the header, the lengths, the mask
 * and the chunk size; REFIT_ERR_INVALID_ARGUMENT (a trailer other than 0
 * or 8). */
refit_status_t refit_place_cuda_tiles(const refit_place_cuda_chunk_t *c, int64_t chunk,
                                      const void *host_bytes,
                                      refit_place_cuda_tile_t *tiles, int64_t *ntiles);

/* Check: reads the deltas and the bytes they name at their places, writes
 * outs and, for a bad chunk, posts key = chunk << 40 | reason << 32 | detail
 * (refit_delta_cuda_reason_t: POS_RANGE and POS_ORDER with the position's
 * index, POS_SAME with its offset, BLOCK_SAME with the block's first offset)
 * into *err by atomicMin; the caller sets *err to UINT64_MAX first. */
refit_status_t refit_place_check_cuda(const refit_place_cuda_chunk_t *chunks,
                                      const refit_place_cuda_tile_t *tiles,
                                      int64_t ntiles, refit_place_cuda_out_t *outs,
                                      unsigned long long *err, cudaStream_t stream);

/* Write: after a check of the same tables that passed, with nothing changed
 * in between, and no chunk twice in the tables. With undo_at (NULL: none),
 * every written byte's address and old value go to undo_at[i], undo_old[i]
 * for i taken from *undo_next (atomicAdd; the caller leaves room for the
 * check's changed bytes); an entry taken and not written (a byte found equal
 * after all) has address 0. */
refit_status_t refit_place_write_cuda(const refit_place_cuda_chunk_t *chunks,
                                      const refit_place_cuda_tile_t *tiles,
                                      int64_t ntiles, refit_place_cuda_out_t *outs,
                                      uint64_t *undo_at, uint8_t *undo_old,
                                      unsigned long long *undo_next, cudaStream_t stream);

/* Undo n logged writes: *undo_at[i] = undo_old[i] (each address once;
 * address 0: none). */
refit_status_t refit_place_undo_cuda(const uint64_t *undo_at, const uint8_t *undo_old,
                                     int64_t n, cudaStream_t stream);

/* REFIT_ERR_INTEGRITY naming the chunk's failed check for a posted key
 * (*chunk: the chunk's index), REFIT_OK for UINT64_MAX (none). */
refit_status_t refit_place_cuda_report(unsigned long long key, int64_t *chunk);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_KERNELS_PLACE_CUDA_H */

/*
 * Data-path kernels of a refit: the batched copies that move chunks between
 * trainer shards, wire buffers, staging areas and generator storage, and the
 * synthetic-weight generator. Each has a portable C reference (this file,
 * datapath.c) and a CUDA twin (datapath_cuda.h) that writes the same bytes.
 *
 * The plan is static, so the runtime builds one descriptor table per bucket
 * once at start-up and replays it every refit: one call per bucket, not one
 * per chunk.
 *
 * Wire format of a chunk (see reshard/plan.h): `rows` rows of `row_bytes`
 * bytes back to back; a BF16 row is `cols` uint16, a prequantized MXFP8 row is
 * `cols` e4m3 bytes then `cols / 32` E8M0 scale bytes, a prequantized block
 * FP8 row `cols` e4m3 bytes then ceil(cols / 128) FP32 scale slots (4 bytes
 * each, little-endian, at any alignment): every row carries the scale_inv
 * values of its block row (chunk row r those of block row r / 128; a block
 * FP8 chunk starts on a block row of its tensor), so that each wire byte
 * names one runtime byte (kernels/place.h: a delta refit writes a changed
 * scale from the block row's first row and checks the others against it).
 * When the plan carries digests, an 8-byte little-endian digest of the rows
 * (core/digest.h) follows them.
 */
#ifndef REFIT_KERNELS_DATAPATH_H
#define REFIT_KERNELS_DATAPATH_H

#include "kernels/synth_rules.h"
#include "refit/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  REFIT_CHUNK_COPY = 0,     /* rows of row_bytes, as they are */
  REFIT_CHUNK_QUANTIZE = 1, /* BF16 rows of cols -> MXFP8 (see each op) */
  REFIT_CHUNK_SPLIT = 2,    /* land only: prequantized wire rows -> q + scale */
  REFIT_CHUNK_BLOCK_QUANTIZE = 3, /* pack only: BF16 rows -> block FP8 wire rows */
  REFIT_CHUNK_BLOCK_SPLIT = 4     /* land only: block FP8 wire rows -> q + scale_inv */
} refit_chunk_op_t;

/* FP32 scale slots of a block FP8 wire row of `cols` values (a macro: host
 * and device code both use it). */
#define REFIT_BLOCK_WIRE_SLOTS(cols) (((cols) + 127) / 128)

/*
 * Pack: trainer shard rows -> the bucket's wire buffer.
 *   COPY:     row r = row_bytes bytes from src + r * src_pitch.
 *   QUANTIZE: src rows are `cols` BF16 values (pitch src_pitch bytes); wire
 *             row r = cols e4m3 bytes then cols/32 scale bytes (row_bytes =
 *             cols + cols/32), exactly refit_mxfp8_quantize_rows' bytes.
 *   BLOCK_QUANTIZE: src rows are `cols` BF16 values, the rectangle a chunk of
 *             whole 128 x 128 blocks (reshard/blocks.h); it is quantized
 *             alone as refit_fp8_block_quantize does (scale mode fp8_scale)
 *             into wire rows of cols e4m3 bytes then the scale slots
 *             (row_bytes = cols + 4 * REFIT_BLOCK_WIRE_SLOTS(cols)).
 * The wire rows start at dst_offset in the buffer; with `digest` set the
 * digest of the rows (rows * row_bytes bytes), sealed with seal_key and the
 * call's tag, is written right after them.
 */
typedef struct {
  const void *src;
  int64_t src_pitch; /* bytes between source rows */
  int64_t dst_offset;
  int64_t rows, cols, row_bytes;
  int32_t op;     /* REFIT_CHUNK_COPY, _QUANTIZE or _BLOCK_QUANTIZE */
  int32_t digest; /* 1: write the 8-byte sealed digest after the rows */
  uint64_t seal_key; /* refit_seal_key of the chunk */
  int32_t fp8_scale; /* BLOCK_QUANTIZE: refit_fp8_scale_t */
  int32_t reserved;
} refit_pack_desc_t;

/*
 * Land: a staging chunk -> generator storage.
 *   COPY:     wire row r (row_bytes) -> dst + r * dst_pitch.
 *   QUANTIZE: wire row r is `cols` BF16 -> e4m3 at dst + r * dst_pitch and
 *             cols/32 scales at scale + r * scale_pitch.
 *   SPLIT:    wire row r is cols e4m3 + cols/32 scales -> the same places.
 *   BLOCK_SPLIT: wire row r is cols e4m3 + scale slots: the values to
 *             dst + r * dst_pitch, the slots of row 128 b (4 * slots bytes)
 *             to scale + b * scale_pitch (bytes); the other rows' slots,
 *             repeats of their block row's, are not read.
 * With `digest` set the digest of the wire rows, sealed with seal_key and the
 * call's tag, is checked against the 8 bytes that follow them, computed from
 * the bytes read while landing them (a chunk of another refit fails too). A
 * mismatch is reported (see refit_land_rows), and the chunk lands all the same.
 *
 * Why a bad chunk lands: the runtime discards the whole refit on any bad
 * digest (refit_loader_land_bucket returns REFIT_ERR_INTEGRITY; sync mode then
 * restores the saved copy, async mode drops the shadow, restore: none marks
 * the generator POISONED), so the corrupt bytes in generator storage are never
 * served. Holding them back would need every digest before anything lands, a
 * second full read of the staging area that cost a refit of Qwen3-30B-A3B 14%
 * of its time on an H200; landing is therefore one pass, with the digest
 * fused into the copy, quantize and split loops.
 */
typedef struct {
  int64_t src_offset; /* in the staging area */
  int64_t rows, cols, row_bytes;
  void *dst;
  int64_t dst_pitch;
  void *scale;
  int64_t scale_pitch;
  int32_t op;
  int32_t digest;
  uint64_t seal_key; /* refit_seal_key of the chunk */
} refit_land_desc_t;

/*
 * Check a descriptor table once, when it is built (the CUDA twins read their
 * tables from device memory and cannot report a bad descriptor; they skip
 * what they cannot execute safely). Rules: non-negative shape and offsets;
 * digest 0 or 1; QUANTIZE and SPLIT need cols % 32 == 0; row_bytes is
 * cols + cols/32 for pack QUANTIZE and land SPLIT, 2 * cols for land
 * QUANTIZE and cols + 4 * REFIT_BLOCK_WIRE_SLOTS(cols) for BLOCK_QUANTIZE
 * and BLOCK_SPLIT; BLOCK_QUANTIZE needs fp8_scale 0 or 1; pitches hold a
 * row (when rows > 1; BLOCK_SPLIT's scale_pitch a block row's slots when
 * rows > 128); no NULL buffer that would be touched.
 * REFIT_ERR_INVALID_ARGUMENT names the descriptor index and the rule.
 */
refit_status_t refit_pack_descs_check(const refit_pack_desc_t *descs, int64_t n);
refit_status_t refit_land_descs_check(const refit_land_desc_t *descs, int64_t n);

/* Host reference of pack: all `n` descriptors into `buf`, digests sealed
 * with `tag` (refit_seal_tag of the refit). */
refit_status_t refit_pack_rows(const refit_pack_desc_t *descs, int64_t n, uint64_t tag,
                               void *buf);

/* Host reference of land. Every descriptor lands, those whose digest did not
 * match too (see refit_land_desc_t for why); *bad_chunk = index of the first
 * of them, or -1. The call still returns REFIT_OK then (the caller knows the
 * chunk's tensor, reports it as REFIT_ERR_INTEGRITY and discards the refit).
 * Errors: a bad table (refit_land_descs_check); outputs untouched then. */
refit_status_t refit_land_rows(const refit_land_desc_t *descs, int64_t n, uint64_t tag,
                               const void *staging, int64_t *bad_chunk);

/*
 * Synthetic weights (runtime/src/source/synth.h states the model, kernels/
 * synth_rules.h the definition): element (row, col) of a tensor with
 * `tensor_cols` columns is refit_synth_value(key, row * tensor_cols + col).
 * Fill rows x cols from global (row0, col0), row-major with `cols` per row.
 */
void refit_synth_rect(const refit_synth_key_t *key, int64_t tensor_cols, int64_t row0,
                      int64_t col0, int64_t rows, int64_t cols, uint16_t *dst);

/*
 * Synthetic rows of different tensors (the expected values of a verification):
 * row r of dst (cols values) = refit_synth_value(&keys[r], bases[r] + c) for
 * c < cols.
 */
void refit_synth_rows(const refit_synth_key_t *keys, const int64_t *bases, int64_t rows,
                      int64_t cols, uint16_t *dst);

/*
 * Compare two buffers element by element (elem = 1, 2 or 4 bytes, bytes % elem
 * == 0): *count = number of differing elements, *first = index of the first
 * one or INT64_MAX when they are equal. The CUDA twin accumulates into
 * caller-initialized device values instead (see datapath_cuda.h).
 */
refit_status_t refit_compare(const void *a, const void *b, size_t bytes,
                             size_t elem, int64_t *count, int64_t *first);

/* The argument rule of refit_compare and its twin. */
refit_status_t refit_compare_check(size_t bytes, size_t elem);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_KERNELS_DATAPATH_H */

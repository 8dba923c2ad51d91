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
 * `cols` e4m3 bytes then `cols / 32` E8M0 scale bytes. When the plan carries
 * digests, an 8-byte little-endian digest of the rows (runtime/src/core/
 * digest.h) follows them.
 */
#ifndef REFIT_KERNELS_DATAPATH_H
#define REFIT_KERNELS_DATAPATH_H

#include "refit/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  REFIT_CHUNK_COPY = 0,     /* rows of row_bytes, as they are */
  REFIT_CHUNK_QUANTIZE = 1, /* BF16 rows of cols -> MXFP8 (see each op) */
  REFIT_CHUNK_SPLIT = 2     /* land only: prequantized wire rows -> q + scale */
} refit_chunk_op_t;

/*
 * Pack: trainer shard rows -> the bucket's wire buffer.
 *   COPY:     row r = row_bytes bytes from src + r * src_pitch.
 *   QUANTIZE: src rows are `cols` BF16 values (pitch src_pitch bytes); wire
 *             row r = cols e4m3 bytes then cols/32 scale bytes (row_bytes =
 *             cols + cols/32), exactly refit_mxfp8_quantize_rows' bytes.
 * The wire rows start at dst_offset in the buffer; with `digest` set the
 * digest of the rows (rows * row_bytes bytes) is written right after them.
 */
typedef struct {
  const void *src;
  int64_t src_pitch; /* bytes between source rows */
  int64_t dst_offset;
  int64_t rows, cols, row_bytes;
  int32_t op;     /* REFIT_CHUNK_COPY or REFIT_CHUNK_QUANTIZE */
  int32_t digest; /* 1: write the 8-byte digest after the rows */
} refit_pack_desc_t;

/*
 * Land: a staging chunk -> generator storage.
 *   COPY:     wire row r (row_bytes) -> dst + r * dst_pitch.
 *   QUANTIZE: wire row r is `cols` BF16 -> e4m3 at dst + r * dst_pitch and
 *             cols/32 scales at scale + r * scale_pitch.
 *   SPLIT:    wire row r is cols e4m3 + cols/32 scales -> the same places.
 * With `digest` set the digest of the wire rows is checked against the 8
 * bytes that follow them first; a mismatch lands nothing of that chunk and is
 * reported (see refit_land_rows).
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
} refit_land_desc_t;

/* Host reference of pack: all `n` descriptors into `buf`. */
refit_status_t refit_pack_rows(const refit_pack_desc_t *descs, int64_t n,
                               void *buf);

/* Host reference of land. *bad_chunk = index of the first descriptor whose
 * digest did not match (those chunks are not landed), or -1. */
refit_status_t refit_land_rows(const refit_land_desc_t *descs, int64_t n,
                               const void *staging, int64_t *bad_chunk);

/*
 * Synthetic weights (runtime/src/synth.h states the definition): element
 * (row, col) of a tensor with `tensor_cols` columns is
 * refit_synth_value(key, norm, row * tensor_cols + col). Fill rows x cols
 * from global (row0, col0), row-major with `cols` per row.
 */
void refit_synth_rect(uint64_t key, int norm, int64_t tensor_cols, int64_t row0,
                      int64_t col0, int64_t rows, int64_t cols, uint16_t *dst);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_KERNELS_DATAPATH_H */

/*
 * The zero-copy data path of ranks that share a GPU (C reference; CUDA twin in
 * kernels/direct_cuda.h). The generator reads the trainer's BF16 shard rows
 * where they are (through a CUDA IPC mapping) and writes each row straight to
 * its final place in the runtime layout: MXFP8 values at the row's place
 * after the layout's row permutation, scale bytes at their 128x4-swizzled
 * places (kernels/layout.h states both rules). No wire buffer, no staging, no
 * assembly arena and no second layout pass.
 *
 * Integrity. There is no wire to protect, but the generator must still know
 * that it read the version the trainer meant, from the rows the plan names:
 * the trainer computes each chunk's sealed digest (core/digest.h) of its rows
 * as a wire chunk would hold them (rows x cols BF16, back to back) and sends
 * these 8-byte digests; the generator sums the same digest from the words it
 * reads while landing and compares. A chunk read from the wrong place, at the
 * wrong version, or changed between the two reads fails the check.
 */
#ifndef REFIT_KERNELS_DIRECT_H
#define REFIT_KERNELS_DIRECT_H

#include "refit/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  REFIT_DIRECT_COPY = 0,     /* BF16 rows as they are: row r -> dst + r * dst_pitch */
  REFIT_DIRECT_QUANTIZE = 1, /* BF16 rows -> MXFP8 in the runtime layout */
  REFIT_DIRECT_DIGEST = 2,   /* trainer: the rows' sealed digest only */
  REFIT_DIRECT_PAD = 3,      /* the padding bytes of one quantized tensor -> 0 */
  REFIT_DIRECT_SPLIT = 4,    /* prequantized MXFP8 rows -> the runtime layout */
  REFIT_DIRECT_BLOCK_QUANTIZE = 5 /* BF16 whole 128 x 128 blocks -> block FP8 */
} refit_direct_op_t;

/*
 * One chunk (or, for PAD, one tensor).
 *
 * COPY, QUANTIZE, DIGEST read `rows` rows of `cols` BF16 values at src (row r
 * at src + r * src_pitch bytes); SPLIT reads rows of `cols` E4M3 bytes then
 * cols / 32 E8M0 scale bytes (a prequantized wire row, kernels/datapath.h).
 * With `staged` set, src is not used: the rows are at src_offset of the
 * call's buffer, a staging area that holds wire chunks with their digest
 * trailers (the staged loader lands MXFP8 chunks this way, straight into the
 * runtime layout); else they are read in place (zero copy). With `digest`
 * set, the sealed digest of those rows taken as rows * row bytes back to
 * back (2 * cols a BF16 row, cols + cols / 32 a SPLIT row; the sum of
 * core/digest.h, then refit_seal(seal_key, tag)) is written (DIGEST) or
 * compared with (COPY, QUANTIZE, SPLIT) the 8 little-endian bytes at
 * digest_offset of the call's buffer.
 *
 * QUANTIZE: element (r, c) is element (R, C) = (row0 + r, col0 + c) of the
 * canonical tensor [*, k] (cols % 32 == 0, col0 % 32 == 0). Its group is
 * e = R / group_rows, its row in the group i = R % group_rows, and its row in
 * the runtime layout j = i when perm < 0, else the inverse of permutation
 * `perm` (a refit_kernels_perm_kind_t) over perm_rows rows at i. The E4M3
 * byte goes to dst + e * value_group_bytes + j * k + C, the scale of block
 * C / 32 to scale + e * scale_group_bytes + refit_kernels_swizzle_offset(j,
 * C / 32, round_up(k / 32, 4)).
 *
 * SPLIT: the E4M3 bytes and the scale byte of each block go where QUANTIZE
 * puts them (the same fields and rules); nothing is computed.
 *
 * BLOCK_QUANTIZE: the rows (read in place, never staged) are a rectangle of
 * whole 128 x 128 blocks of a block FP8 tensor (reshard/blocks.h; a partial
 * block holds its tensor's last element), quantized alone as
 * refit_fp8_block_quantize does with scale mode fp8_scale: E4M3 row r to
 * dst + r * dst_pitch, the FP32 scale_inv of block (b, c) to scale +
 * b * scale_pitch + 4 * c (bytes). Its digest is the BF16 rows', as COPY's.
 * The CUDA twin's tile kernels only read and digest these rows; the values
 * and scales are written by refit_direct_blocks_cuda (direct_cuda.h).
 *
 * PAD: `rows` groups of the tensor above (dst, scale, k, group_rows,
 * perm_rows, perm, group byte strides): value rows j < perm_rows whose source
 * row perm(j) >= group_rows, and every scale byte (j, c) of the swizzled
 * [round_up(perm_rows, 128), round_up(k / 32, 4)] matrix with c >= k / 32,
 * j >= perm_rows or (perm >= 0 and perm(j) >= group_rows), become 0: the
 * bytes a layout transform writes as padding, which no chunk touches.
 */
typedef struct {
  const void *src;
  int64_t src_pitch;
  int64_t rows, cols;
  int32_t op;
  int32_t digest;
  uint64_t seal_key;
  int64_t digest_offset;
  void *dst;
  int64_t dst_pitch; /* COPY */
  void *scale;
  int64_t row0, col0, k;
  int64_t group_rows, perm_rows;
  int64_t value_group_bytes, scale_group_bytes;
  int32_t perm;
  int32_t staged;      /* 1: the rows are at src_offset of the call's buffer */
  int64_t src_offset;  /* staged */
  int64_t scale_pitch; /* BLOCK_QUANTIZE: bytes between block rows of scales */
  int32_t fp8_scale;   /* BLOCK_QUANTIZE: refit_fp8_scale_t */
  int32_t reserved;
  /* The 128 x 128 blocks of the BLOCK_QUANTIZE descriptors before this one
   * in its table (refit_direct_number_blocks): where the CUDA twin's one
   * launch finds a block's descriptor. */
  int64_t block0;
} refit_direct_desc_t;

/*
 * Check a table once, when it is built (the CUDA twin skips what it cannot
 * execute safely and cannot report it). Rules: known op; non-negative shape;
 * digest 0 or 1 (0 for PAD); staged 0 or 1 (0 for PAD, DIGEST and
 * BLOCK_QUANTIZE), with src_offset >= 0; non-NULL buffers that are touched; src_pitch >=
 * the row bytes (rows > 1); COPY dst_pitch >= 2 * cols; QUANTIZE and SPLIT cols, col0 and
 * k multiples of 32, col0 + cols <= k, group_rows >= 1, perm_rows >= group_rows (equal
 * when perm < 0), perm_rows % 32 == 0 (64 for SRC13) when perm >= 0; digest_offset >= 0
 * where a digest is used, and 8-byte aligned unless staged (a staged trailer follows its
 * rows wherever they end); BLOCK_QUANTIZE dst_pitch >= cols, scale_pitch >= 4 * ceil(cols
 * / 128) (when rows > 128), fp8_scale 0 or 1. REFIT_ERR_INVALID_ARGUMENT names the
 * descriptor index and the rule.
 */
refit_status_t refit_direct_descs_check(const refit_direct_desc_t *descs, int64_t n);

/*
 * Number the 128 x 128 blocks of a table's BLOCK_QUANTIZE descriptors: every
 * descriptor's block0 becomes the count of those before it. Returns the
 * table's total. Call it once the table is built, before it is uploaded.
 */
int64_t refit_direct_number_blocks(refit_direct_desc_t *descs, int64_t n);

/*
 * Host reference: every descriptor in order, digests sealed with `tag`;
 * `digests` is the call's buffer (digests, and staged rows).
 * *bad_chunk = the index of the first COPY, QUANTIZE or SPLIT descriptor whose
 * digest did not match, or -1; it has landed all the same (the runtime
 * discards the refit, as for a staged chunk: kernels/datapath.h says why).
 * Errors: a bad table; nothing is written then.
 */
refit_status_t refit_direct_rows(const refit_direct_desc_t *descs, int64_t n,
                                 uint64_t tag, void *digests, int64_t *bad_chunk);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_KERNELS_DIRECT_H */

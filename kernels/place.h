/*
 * Where each byte of a chunk lands (issue "Delta refit": deltas applied in
 * place in runtime storage). A chunk is a rectangle of a generator tensor as
 * the wire carries it (kernels/datapath.h): `rows` rows of row_bytes, a BF16
 * row `cols` uint16 values, a prequantized MXFP8 row `cols` e4m3 values then
 * `cols / 32` E8M0 scales, a prequantized block FP8 row `cols` e4m3 values
 * then ceil(cols / 128) FP32 scales, those of its block row. The lander
 * (refit_land_rows, then the layout transform of kernels/layout.h once the
 * tensor is complete) moves those bytes into the runtime tensors; this file
 * says, for every wire byte of the chunk's rows, the runtime address that
 * byte ends up at, without moving anything:
 *
 *   BF16 (layout linear)     row r, byte b -> data + ((row0 + r) * K + col0) * 2 + b
 *   MXFP8 value (row R, col C of the tensor, R = row0 + r, C = col0 + c):
 *                            matrix e = R / M, row R % M of it goes to output
 *                            row j = inverse(perm)(R % M) (identity without
 *                            a permutation), at values + e * P * K + j * K + C
 *   MXFP8 scale (row R, scale column s = col0 / 32 + c'):
 *                            scales + e * round_up(P, 128) * Kp +
 *                            swizzle_offset(j, s, Kp), Kp = round_up(K / 32, 4)
 *
 *   block FP8 value          data + R * K + C (vLLM's weight, e4m3 [E * M, K])
 *   block FP8 scale (row R, slot s = c' / 4, byte c' % 4 of its FP32):
 *                            scales + ((e * ceil(M / 128) + (R % M) / 128) *
 *                            ceil(K / 128) + col0 / 128 + s) * 4 + c' % 4
 *                            (weight_scale_inv, FP32 [E * ceil(M / 128),
 *                            ceil(K / 128)])
 *
 * with M the rows of one stacked matrix (an expert's; the whole tensor for a
 * dense one) and P the rows of its runtime value layout (M, or M padded to
 * 128 for flashinfer_trtllm dense). The rules come from layout.h's helpers
 * (refit_kernels_dense_rows, refit_kernels_moe_tensor_dims,
 * refit_kernels_perm_inverse_index, refit_kernels_swizzle_offset); the unit
 * test checks every byte against the lander itself. BF16 rows on the wire of
 * a tensor quantized on the generator have no place: quantization is not
 * bytewise (one changed value can change its block's scale and so all 32
 * values), and refit_place_chunk refuses them.
 *
 * Block FP8 scales repeat: every wire row of a block row carries the block
 * row's scales, so the up to 128 rows of one block row name the same scale
 * bytes. The first of them (chunk row r % 128 == 0, the row refit_land_rows
 * takes the scales from) writes a scale; the others are repeats
 * (refit_place_repeat): they read their place, so that the apply's checks
 * and digest hold for every wire byte, and never write it, so that applying
 * a chunk leaves what landing the same bytes leaves. The trainer writes
 * every repeat equal to its first row (kernels/datapath.c); a wire whose
 * repeats disagreed would fail the next delta's digest (its old words read
 * back from the places), and that refit is discarded and the one after it
 * full. A block FP8
 * scale's place is a fused piece's own scale row when every piece of the
 * tensor starts on a block row of its matrix (vLLM's rule for block FP8
 * shards, reshard/blocks.h), which the formula above assumes.
 */
#ifndef REFIT_KERNELS_PLACE_H
#define REFIT_KERNELS_PLACE_H

#include "kernels/layout.h"
#include "refit/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  REFIT_PLACE_BF16 = 0,     /* BF16 values, linear [rows, cols] */
  REFIT_PLACE_MXFP8 = 1,    /* e4m3 values in a permuted layout + swizzled scales */
  REFIT_PLACE_FP8_BLOCK = 2 /* e4m3 values, linear, + FP32 scales per 128 x 128 */
} refit_place_kind_t;

/* A runtime tensor as the mapper sees it (set by the refit_place_*_tensor
 * constructors, which state the layout rules once). */
typedef struct {
  int kind;             /* refit_place_kind_t */
  int64_t rows, cols;   /* the canonical matrix [rows, cols], matrices stacked */
  int64_t matrices;     /* stacked matrices (MoE experts); 1 for dense */
  int perm;             /* refit_kernels_perm_kind_t over `perm_rows`, or -1 */
  int64_t perm_rows;    /* P: rows of one matrix's runtime value layout */
  uint8_t *values;      /* BF16 store, or the e4m3 store */
  uint8_t *scales;      /* the swizzled E8M0 store (MXFP8), weight_scale_inv
                           (block FP8), else NULL */
} refit_place_tensor_t;

/* A chunk: rows x cols of the tensor from (row0, col0). */
typedef struct {
  const refit_place_tensor_t *t;
  int64_t row0, col0, rows, cols;
  int64_t row_bytes; /* on the wire: 2 * cols, cols + cols / 32, or
                        cols + 4 * ceil(cols / 128) */
} refit_place_chunk_t;

/* A BF16 tensor [rows, cols] at `data` (layout linear). */
refit_status_t refit_place_bf16_tensor(int64_t rows, int64_t cols, uint8_t *data,
                                       refit_place_tensor_t *out);

/* A dense MXFP8 tensor [n, k] of `backend` (weight and scale as
 * refit_kernels_dense_transform writes them). */
refit_status_t refit_place_dense_tensor(refit_kernels_dense_backend_t backend, int64_t n,
                                        int64_t k, uint8_t *weight, uint8_t *scale,
                                        refit_place_tensor_t *out);

/* One tensor of a MoE layer, all experts stacked (as
 * refit_kernels_moe_transform_tensor writes it). */
refit_status_t refit_place_moe_tensor(const refit_kernels_moe_shape_t *s,
                                      refit_kernels_moe_tensor_t which, uint8_t *weight,
                                      uint8_t *scale, refit_place_tensor_t *out);

/* A block FP8 tensor of `matrices` stacked matrices, [rows, cols] in all
 * (rows a multiple of matrices): its e4m3 weight [rows, cols] and its FP32
 * weight_scale_inv [matrices * ceil(rows / matrices / 128), ceil(cols /
 * 128)], as the lander's BLOCK_SPLIT writes them. */
refit_status_t refit_place_fp8_block_tensor(int64_t matrices, int64_t rows, int64_t cols,
                                            uint8_t *weight, uint8_t *scale_inv,
                                            refit_place_tensor_t *out);

/* Chunk rows x cols at (row0, col0) of `t`: checks that it lies in the
 * tensor, that MXFP8 column ranges are whole 32-blocks, and that a block FP8
 * chunk is whole blocks of one matrix: it starts on a block row and column
 * and ends on one or at its matrix's last row and the last column. `t` must
 * outlive the chunk. Errors: REFIT_ERR_INVALID_ARGUMENT naming the rule. */
refit_status_t refit_place_chunk(const refit_place_tensor_t *t, int64_t row0, int64_t col0,
                                 int64_t rows, int64_t cols, refit_place_chunk_t *out);

/* The runtime address of wire byte `off` of the chunk's rows
 * (0 <= off < rows * row_bytes, unchecked: the caller bounds it), and in
 * *run (may be NULL) how many wire bytes from `off` on lie at consecutive
 * addresses from there (at least 1): the rest of a row's values, or of a
 * group of 4 scales. Inline for the CUDA twin of the apply below
 * (kernels/place_cuda.h), which walks the same places on a GPU. */
static inline REFIT_HD uint8_t *refit_place_addr(const refit_place_chunk_t *c, int64_t off,
                                                 int64_t *run) {
  const refit_place_tensor_t *t = c->t;
  const int64_t r = off / c->row_bytes, b = off % c->row_bytes, R = c->row0 + r;
  int64_t n;
  uint8_t *at;
  if (t->kind == REFIT_PLACE_BF16) {
    n = c->row_bytes - b;
    at = t->values + (R * t->cols + c->col0) * 2 + b;
  } else if (t->kind == REFIT_PLACE_FP8_BLOCK) {
    if (b < c->cols) {
      n = c->cols - b;
      at = t->values + R * t->cols + c->col0 + b;
    } else { /* a row's slots are consecutive floats of its scale row */
      const int64_t m = t->rows / t->matrices, e = R / m;
      const int64_t srow = e * ((m + 127) / 128) + (R - e * m) / 128;
      n = c->row_bytes - b;
      at = t->scales + (srow * ((t->cols + 127) / 128) + c->col0 / 128) * 4 +
           (b - c->cols);
    }
  } else {
    const int64_t m = t->rows / t->matrices, e = R / m, i = R % m;
    const int64_t j =
        t->perm < 0 ? i
                    : refit_kernels_perm_inverse_index((refit_kernels_perm_kind_t)t->perm,
                                                       t->perm_rows, i);
    if (b < c->cols) {
      n = c->cols - b;
      at = t->values + (e * t->perm_rows + j) * t->cols + c->col0 + b;
    } else {
      const int64_t kp = refit_round_up(t->cols / 32, 4);
      const int64_t s = c->col0 / 32 + (b - c->cols);
      const int64_t left = c->row_bytes - b;
      n = 4 - s % 4 < left ? 4 - s % 4 : left;
      at = t->scales + e * refit_round_up(t->perm_rows, 128) * kp +
           refit_kernels_swizzle_offset(j, s, kp);
    }
  }
  if (run != NULL)
    *run = n;
  return at;
}

/* Is wire byte `off` of the chunk's rows a repeat: a block FP8 scale byte of
 * a row other than its block row's first, whose place the first one writes
 * (see above)? Its run (refit_place_addr) is all repeats too. */
static inline REFIT_HD int refit_place_repeat(const refit_place_chunk_t *c, int64_t off) {
  if (c->t->kind != REFIT_PLACE_FP8_BLOCK)
    return 0;
  const int64_t r = off / c->row_bytes;
  return r % 128 != 0 && off - r * c->row_bytes >= c->cols;
}

/*
 * A chunk's delta (kernels/delta.h), or its whole span (`full`: the rows and
 * the trailer as a full message carries them), applied through the places
 * of its rows, in two steps so that nothing is written before the whole
 * chunk is known good (and the caller can save what it is about to
 * overwrite in between):
 *
 * check  reads the delta and the bytes it names from their places: its shape
 *        (refit_delta_info: header, lengths, mask), positions in increasing
 *        order inside the span, and the baseline rule of delta.h (a position
 *        whose byte, or a marked block whose bytes, the destination holds
 *        already is an error: the delta was made against other bytes). The
 *        span's last `trailer_bytes` (0, or 8: the sealed digest) have no
 *        place; their committed value is `old_trailer`. Gives the row bytes
 *        that change and write will write (repeats are not counted), the new
 *        trailer, and the new unsealed digest of the rows (core/digest.h):
 *        `old_sum`, the committed rows' digest, plus term(new word, i) -
 *        term(old word, i) over the 8-byte words the change touches, old
 *        words read from their places (a repeat's too: the digest covers it
 *        like any wire byte). Writes nothing. Errors: REFIT_ERR_INTEGRITY
 *        naming the rule.
 * write  writes every row byte whose value changes but repeats; *written
 *        counts them (check's `changed`). With `undo_at` and `undo_old`
 *        (room for check's `changed` entries each; NULL: none) it also
 *        records each written byte's address and old value, in write order,
 *        so that the caller can undo the write. Call it only after check
 *        passed, with the same inputs and nothing changed in between.
 *
 * Unchanged bytes are neither read nor written beyond the words a change
 * touches (dense and full spans compare every byte once, run by run).
 */
typedef struct {
  uint64_t changed;     /* row bytes whose value changes, repeats left out */
  uint64_t sum;         /* unsealed digest of the new rows */
  uint64_t trailer;     /* the new trailer (trailer_bytes 8), else 0 */
  const char *encoding; /* "positions", "mask", "dense", "whole" */
} refit_place_delta_t;

refit_status_t refit_place_delta_check(const refit_place_chunk_t *c, int trailer_bytes,
                                       uint64_t old_sum, uint64_t old_trailer,
                                       const void *bytes, size_t len, int full,
                                       refit_place_delta_t *out);
refit_status_t refit_place_delta_write(const refit_place_chunk_t *c, int trailer_bytes,
                                       const void *bytes, size_t len, int full,
                                       uint8_t **undo_at, uint8_t *undo_old,
                                       uint64_t *written);

/* ---- The batch form of the apply's GPU twin (kernels/place_cuda.h) ---- */

/* One chunk to apply: the place of its rows and what to apply there. */
typedef struct {
  refit_place_tensor_t t;                    /* its tensor, by value (device stores) */
  int64_t row0, col0, rows, cols, row_bytes; /* as refit_place_chunk_t */
  const uint8_t *bytes;                      /* the delta, or the whole span (full) */
  uint64_t len;
  int32_t full;          /* bytes is the span itself, rows then trailer */
  int32_t trailer_bytes; /* 0 or 8 (the sealed digest) */
  uint64_t old_trailer;  /* the committed trailer (trailer_bytes 8) */
} refit_place_cuda_chunk_t;

/* Per chunk, written by the calls; set by the caller before check to
 * changed = sum = written = 0 and trailer = old_trailer. */
typedef struct {
  uint64_t changed; /* check: row bytes that change, repeats left out */
  uint64_t sum;     /* check: sum of term(new) - term(old) over changed words */
  uint64_t trailer; /* check: the new trailer (little-endian bytes) */
  uint64_t written; /* write: row bytes written */
} refit_place_cuda_out_t;

#ifdef __cplusplus
}
#endif

#endif /* REFIT_KERNELS_PLACE_H */

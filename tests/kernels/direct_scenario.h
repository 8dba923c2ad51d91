/*
 * A zero-copy refit scenario for the direct data-path tests (host and GPU).
 * Five runtime tensors of one generator, each fed from a trainer shard whose
 * rows are wider than the tensor (a pitched read) at a misaligned offset:
 *
 *   0  MoE w13 [E=2, 2I=128, H=128], TRTLLM layout (src13 rows, swizzled scales)
 *   1  MoE w2  [E=2, H=128, I=64],   TRTLLM layout (src32 rows; K/32 = 2 pads
 *      the scale columns to 4)
 *   2  dense [100, 256] flashinfer_trtllm (rows padded to 128, src32)
 *   3  dense [70, 96] flashinfer_cutlass (scale rows padded to 128, columns to 4)
 *   4  BF16 [37, 50] (a norm-like tensor: COPY, rows of 100 bytes, so 8-byte
 *      words straddle rows)
 *
 * The aligned variant (dis_create_aligned) is the shape a real refit mostly
 * has, whose trainer digests the CUDA twin reads 16 bytes per lane: 16-byte
 * aligned places and pitches, the BF16 tensor [37, 56] (whole 16-byte units
 * per row) cut in steps of 8 columns, and the quantized tensors whose K is a
 * multiple of 128 cut in steps of 128.
 *
 * Each tensor is cut into random rectangles (rows at random, columns in
 * multiples of 32 for the quantized ones), one chunk each, in shuffled order,
 * plus a PAD descriptor per quantized tensor. The trainer's table computes the
 * chunks' sealed digests (DIGEST), the generator's lands them. Descriptors
 * hold arena offsets in their pointer fields until dis_bind() turns them into
 * pointers into real (host or device) arenas.
 *
 * The expected stores come from a path that shares no code with
 * kernels/direct.c: the whole canonical tensor quantized by
 * refit_mxfp8_quantize_rows, then the step-by-step MoE oracle
 * (refit_kernels_moe_transform_oracle) or the dense transform.
 */
#ifndef REFIT_TESTS_KERNELS_DIRECT_SCENARIO_H
#define REFIT_TESTS_KERNELS_DIRECT_SCENARIO_H

#include "core/digest.h"
#include "kernels/direct.h"
#include "kernels/layout.h"
#include "kernels/mxfp8.h"
#include "kernels_test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { DIS_TENSORS = 5, DIS_MAX_CHUNKS = 512 };

typedef struct {
  int64_t rows, cols; /* canonical [rows, cols] */
  int quantized;
  int64_t src_off, src_pitch; /* in the source arena */
  int64_t w_off, w_bytes, s_off, s_bytes; /* stores in the dst arena */
} dis_tensor_t;

typedef struct {
  dis_tensor_t t[DIS_TENSORS];
  int64_t n; /* descriptors: chunks, then PADs */
  refit_direct_desc_t trainer[DIS_MAX_CHUNKS]; /* DIGEST of each chunk */
  refit_direct_desc_t land[DIS_MAX_CHUNKS];    /* COPY / QUANTIZE, then PAD */
  int64_t nchunks;
  int tensor_of[DIS_MAX_CHUNKS]; /* each chunk's tensor, before the shuffle */
  uint8_t *src; /* host source arena */
  int64_t src_bytes, dst_bytes, digest_bytes;
  uint8_t *init; /* the dst arena before the refit: random bytes */
  uint8_t *want; /* expected dst arena */
} dis_t;

static inline int64_t dis_place(int64_t *used, int64_t bytes, int aligned) {
  const int64_t at = (*used + 15) / 16 * 16 + (aligned ? 0 : 2 * kt_rand_range(0, 3));
  *used = at + bytes;
  return at;
}

/* Cut rows [0, rows) x cols [0, cols) into random rectangles (columns in
 * steps of `step`), appended to the scenario as chunks of tensor ti. */
static inline void dis_cut(dis_t *s, int ti, int64_t step) {
  const dis_tensor_t *t = &s->t[ti];
  int64_t r = 0;
  while (r < t->rows) {
    int64_t nr = kt_rand_range(1, 40);
    if (nr > t->rows - r)
      nr = t->rows - r;
    int64_t c = 0;
    while (c < t->cols) {
      int64_t nc = step * kt_rand_range(1, 4);
      if (nc > t->cols - c)
        nc = t->cols - c;
      refit_direct_desc_t *d = &s->land[s->nchunks];
      memset(d, 0, sizeof(*d));
      d->src = (const void *)(uintptr_t)(t->src_off + r * t->src_pitch + 2 * c);
      d->src_pitch = t->src_pitch;
      d->rows = nr;
      d->cols = nc;
      d->digest = 1;
      d->seal_key = kt_rand();
      d->digest_offset = 8 * s->nchunks;
      d->perm = -1;
      s->tensor_of[s->nchunks] = ti;
      if (t->quantized) {
        d->op = REFIT_DIRECT_QUANTIZE;
        d->row0 = r;
        d->col0 = c;
      } else {
        d->op = REFIT_DIRECT_COPY;
        d->dst = (void *)(uintptr_t)(t->w_off + (r * t->cols + c) * 2);
        d->dst_pitch = t->cols * 2;
      }
      s->nchunks++;
      c += nc;
    }
    r += nr;
  }
}

/* The layout fields of tensor ti's QUANTIZE and PAD descriptors. */
static inline void dis_layout(const dis_t *s, int ti, refit_direct_desc_t *d) {
  const dis_tensor_t *t = &s->t[ti];
  d->dst = (void *)(uintptr_t)t->w_off;
  d->scale = (void *)(uintptr_t)t->s_off;
  d->k = t->cols;
  switch (ti) {
  case 0: /* w13: 2 experts of 128 rows */
    d->group_rows = d->perm_rows = 128;
    d->perm = REFIT_KERNELS_PERM_SRC13;
    d->value_group_bytes = 128 * 128;
    d->scale_group_bytes = refit_kernels_swizzle_bytes(128, 4);
    break;
  case 1: /* w2: 2 experts of 128 rows, K = 64 */
    d->group_rows = d->perm_rows = 128;
    d->perm = REFIT_KERNELS_PERM_SRC32;
    d->value_group_bytes = 128 * 64;
    d->scale_group_bytes = refit_kernels_swizzle_bytes(128, 2);
    break;
  case 2: /* flashinfer_trtllm dense: 100 rows padded to 128 */
    d->group_rows = 100;
    d->perm_rows = 128;
    d->perm = REFIT_KERNELS_PERM_SRC32;
    break;
  default: /* flashinfer_cutlass dense */
    d->group_rows = d->perm_rows = t->rows;
    d->perm = -1;
    break;
  }
}

static inline void dis_create_mode(dis_t *s, int aligned) {
  memset(s, 0, sizeof(*s));
  const int64_t shape[DIS_TENSORS][3] = {
      {256, 128, 1}, {256, 64, 1}, {100, 256, 1}, {70, 96, 1}, {37, aligned ? 56 : 50, 0}};
  int64_t src_used = 0, dst_used = 0;
  for (int i = 0; i < DIS_TENSORS; i++) {
    dis_tensor_t *t = &s->t[i];
    t->rows = shape[i][0];
    t->cols = shape[i][1];
    t->quantized = (int)shape[i][2];
    t->src_pitch = aligned ? (2 * t->cols + 15) / 16 * 16 + 64 * kt_rand_range(0, 3)
                           : 2 * (t->cols + kt_rand_range(0, 3) * 32 + 2 * kt_rand_range(0, 1));
    t->src_off = dis_place(&src_used, t->rows * t->src_pitch, aligned);
    if (t->quantized) {
      int64_t wb, sb;
      if (i <= 1) {
        const refit_kernels_moe_shape_t m = {2, 128, 64, 1};
        refit_kernels_moe_sizes_t sz;
        (void)refit_kernels_moe_check_shape(&m, "w", &sz);
        wb = i == 0 ? sz.w13_weight : sz.w2_weight;
        sb = i == 0 ? sz.w13_weight_scale : sz.w2_weight_scale;
      } else {
        (void)refit_kernels_dense_sizes(i == 2 ? REFIT_KERNELS_DENSE_FLASHINFER_TRTLLM
                                               : REFIT_KERNELS_DENSE_FLASHINFER_CUTLASS,
                                        t->rows, t->cols, &wb, &sb);
      }
      t->w_bytes = wb;
      t->s_bytes = sb;
      t->w_off = dis_place(&dst_used, wb, aligned);
      t->s_off = dis_place(&dst_used, sb, aligned);
    } else {
      t->w_bytes = t->rows * t->cols * 2;
      t->w_off = dis_place(&dst_used, t->w_bytes, aligned);
    }
  }
  s->src_bytes = src_used + 16;
  s->dst_bytes = dst_used + 16;
  for (int i = 0; i < DIS_TENSORS; i++)
    dis_cut(s, i,
            !s->t[i].quantized ? (aligned ? 8 : 3)
                               : (aligned && s->t[i].cols % 128 == 0 ? 128 : 32));
  for (int64_t k = 0; k < s->nchunks; k++)
    if (s->land[k].op == REFIT_DIRECT_QUANTIZE)
      dis_layout(s, s->tensor_of[k], &s->land[k]);
  /* Shuffle the chunks (digest offsets travel with them). */
  for (int64_t k = s->nchunks - 1; k > 0; k--) {
    const int64_t j = kt_rand_range(0, k);
    const refit_direct_desc_t x = s->land[k];
    s->land[k] = s->land[j];
    s->land[j] = x;
  }
  s->n = s->nchunks;
  for (int i = 0; i < 4; i++) {
    refit_direct_desc_t *d = &s->land[s->n++];
    memset(d, 0, sizeof(*d));
    d->op = REFIT_DIRECT_PAD;
    dis_layout(s, i, d);
    d->rows = i <= 1 ? 2 : 1;
  }
  for (int64_t k = 0; k < s->nchunks; k++) {
    refit_direct_desc_t *d = &s->trainer[k];
    memset(d, 0, sizeof(*d));
    d->op = REFIT_DIRECT_DIGEST;
    d->src = s->land[k].src;
    d->src_pitch = s->land[k].src_pitch;
    d->rows = s->land[k].rows;
    d->cols = s->land[k].cols;
    d->digest = 1;
    d->seal_key = s->land[k].seal_key;
    d->digest_offset = s->land[k].digest_offset;
    d->perm = -1;
  }
  s->digest_bytes = 8 * s->nchunks;
  s->src = malloc((size_t)s->src_bytes);
  for (int64_t b = 0; b < s->src_bytes; b += 2) {
    const uint16_t v = kt_rand_bf16();
    memcpy(s->src + b, &v, 2);
  }

  /* The expected stores, whole tensors at once. */
  s->init = malloc((size_t)s->dst_bytes);
  s->want = malloc((size_t)s->dst_bytes);
  kt_fill_bytes(s->init, (size_t)s->dst_bytes);
  memcpy(s->want, s->init, (size_t)s->dst_bytes); /* bytes no store covers stay */
  uint8_t *q[4], *sc[4];
  for (int i = 0; i < 4; i++) {
    const dis_tensor_t *t = &s->t[i];
    uint16_t *canon = malloc((size_t)(t->rows * t->cols) * 2);
    for (int64_t r = 0; r < t->rows; r++)
      memcpy(canon + r * t->cols, s->src + t->src_off + r * t->src_pitch, (size_t)t->cols * 2);
    q[i] = malloc((size_t)(t->rows * t->cols));
    sc[i] = malloc((size_t)(t->rows * t->cols / 32));
    (void)refit_mxfp8_quantize_rows(canon, t->rows, t->cols, t->cols, q[i], t->cols, sc[i],
                                    t->cols / 32);
    free(canon);
  }
  const refit_kernels_moe_shape_t m = {2, 128, 64, 1};
  (void)refit_kernels_moe_transform_oracle(&m, q[0], sc[0], q[1], sc[1],
                                           s->want + s->t[0].w_off, s->want + s->t[0].s_off,
                                           s->want + s->t[1].w_off, s->want + s->t[1].s_off);
  (void)refit_kernels_dense_transform(REFIT_KERNELS_DENSE_FLASHINFER_TRTLLM, 100, 256, q[2],
                                      sc[2], s->want + s->t[2].w_off, s->want + s->t[2].s_off);
  (void)refit_kernels_dense_transform(REFIT_KERNELS_DENSE_FLASHINFER_CUTLASS, 70, 96, q[3],
                                      sc[3], s->want + s->t[3].w_off, s->want + s->t[3].s_off);
  const dis_tensor_t *t4 = &s->t[4];
  for (int64_t r = 0; r < t4->rows; r++)
    memcpy(s->want + t4->w_off + r * t4->cols * 2, s->src + t4->src_off + r * t4->src_pitch,
           (size_t)t4->cols * 2);
  for (int i = 0; i < 4; i++) {
    free(q[i]);
    free(sc[i]);
  }
}

static inline void dis_create(dis_t *s) { dis_create_mode(s, 0); }
static inline void dis_create_aligned(dis_t *s) { dis_create_mode(s, 1); }

/* Offsets in pointer fields -> pointers into the given arenas (staged rows
 * stay offsets into the call's buffer). */
static inline void dis_bind(refit_direct_desc_t *d, int64_t n, const uint8_t *src,
                            uint8_t *dst) {
  for (int64_t k = 0; k < n; k++) {
    if (d[k].op != REFIT_DIRECT_PAD && !d[k].staged)
      d[k].src = src + (uintptr_t)d[k].src;
    if (d[k].op != REFIT_DIRECT_DIGEST)
      d[k].dst = dst + (uintptr_t)d[k].dst;
    if (d[k].op == REFIT_DIRECT_QUANTIZE || d[k].op == REFIT_DIRECT_SPLIT ||
        d[k].op == REFIT_DIRECT_PAD)
      d[k].scale = dst + (uintptr_t)d[k].scale;
  }
}

/*
 * The scenario as the staged loader lands it (runtime/src/generator/loader.c): every
 * chunk's wire rows back to back in a staging area, at odd offsets, each
 * followed by its sealed digest (tag), the land descriptors reading them
 * there (staged) and checking that trailer. With `split` the quantized
 * chunks travel prequantized (each row refit_mxfp8_quantize_rows' bytes)
 * and land by SPLIT; else as BF16, by QUANTIZE. The expected stores are the
 * same. Returns the staging area (malloc'd), its size in *bytes.
 */
static inline uint8_t *dis_stage(dis_t *s, int split, uint64_t tag, int64_t *bytes) {
  int64_t cap = 16;
  for (int64_t k = 0; k < s->nchunks; k++)
    cap += s->land[k].rows * 2 * s->land[k].cols + 8 + 2;
  uint8_t *stage = calloc(1, (size_t)cap);
  int64_t used = 1;
  for (int64_t k = 0; k < s->nchunks; k++) {
    refit_direct_desc_t *d = &s->land[k];
    const uint8_t *src = s->src + (uintptr_t)d->src;
    const int quant = d->op == REFIT_DIRECT_QUANTIZE && split;
    const int64_t rb = quant ? d->cols + d->cols / 32 : 2 * d->cols, len = d->rows * rb;
    for (int64_t r = 0; r < d->rows; r++) {
      uint8_t *row = stage + used + r * rb;
      if (quant) {
        uint16_t *bf = malloc((size_t)d->cols * 2);
        memcpy(bf, src + r * d->src_pitch, (size_t)d->cols * 2);
        (void)refit_mxfp8_quantize_rows(bf, 1, d->cols, d->cols, row, d->cols, row + d->cols,
                                        d->cols / 32);
        free(bf);
      } else {
        memcpy(row, src + r * d->src_pitch, (size_t)rb);
      }
    }
    const uint64_t v = refit_digest64(stage + used, (size_t)len) + refit_seal(d->seal_key, tag);
    for (int b = 0; b < 8; b++)
      stage[used + len + b] = (uint8_t)(v >> (8 * b));
    if (quant)
      d->op = REFIT_DIRECT_SPLIT;
    d->staged = 1;
    d->src = NULL;
    d->src_offset = used;
    d->src_pitch = rb;
    d->digest_offset = used + len;
    used += len + 8 + kt_rand_range(0, 1); /* the next chunk at any alignment */
  }
  *bytes = cap;
  return stage;
}

static inline void dis_destroy(dis_t *s) {
  free(s->src);
  free(s->init);
  free(s->want);
}

#endif /* REFIT_TESTS_KERNELS_DIRECT_SCENARIO_H */

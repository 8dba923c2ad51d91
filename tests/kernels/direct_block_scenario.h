/*
 * A zero-copy block FP8 scenario for the direct data-path tests (host and
 * GPU): BLOCK_QUANTIZE descriptors that read a trainer's pitched BF16 rows in
 * place and write E4M3 values and FP32 scale_inv rows straight into the
 * runtime `weight` and `weight_scale_inv` of two tensors:
 *
 *   0  [300, 384]: whole block columns, a partial last block row; cut every
 *      one or two block rows and, above the last block row, at random
 *      multiples of 128 columns (a rectangle with a partial block must hold the tensor's
 * last element, the padding value: the last block row is one chunk) 1  [200, 392]: a
 * partial block column, so never cut (the plan's REFIT_BLOCK_WIRE_WHOLE): one chunk
 *
 * in shuffled order. Values are random BF16 with adversarial blocks (all
 * zero, tiny, huge). The expected stores are the whole tensors quantized by
 * refit_fp8_block_quantize, one call each: the chunking, the pitches and the
 * scale rows' places are what is checked.
 */
#ifndef REFIT_TESTS_KERNELS_DIRECT_BLOCK_SCENARIO_H
#define REFIT_TESTS_KERNELS_DIRECT_BLOCK_SCENARIO_H

#include "kernels/direct.h"
#include "kernels/fp8_block.h"
#include "kernels_test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { DBS_TENSORS = 2, DBS_MAX_CHUNKS = 32 };

typedef struct {
  int64_t rows, cols;
  int64_t src_off, src_pitch;   /* in the source arena (bytes) */
  int64_t q_off, s_off, s_cols; /* weight and scale_inv in the dst arena */
} dbs_tensor_t;

typedef struct {
  dbs_tensor_t t[DBS_TENSORS];
  int64_t n;
  refit_direct_desc_t trainer[DBS_MAX_CHUNKS]; /* DIGEST of each chunk */
  refit_direct_desc_t land[DBS_MAX_CHUNKS];    /* BLOCK_QUANTIZE */
  uint8_t *src, *init, *want;
  int64_t src_bytes, dst_bytes, digest_bytes;
  int mode; /* refit_fp8_scale_t */
} dbs_t;

static inline void dbs_chunk(dbs_t *s, int ti, int64_t r0, int64_t nr, int64_t c0,
                             int64_t nc) {
  const dbs_tensor_t *t = &s->t[ti];
  refit_direct_desc_t *tr = &s->trainer[s->n], *ld = &s->land[s->n];
  memset(tr, 0, sizeof(*tr));
  tr->op = REFIT_DIRECT_DIGEST;
  /* Pointer fields hold arena offsets until dbs_bind. */
  tr->src = (const void *)(uintptr_t)(t->src_off + r0 * t->src_pitch + 2 * c0);
  tr->src_pitch = t->src_pitch;
  tr->rows = nr;
  tr->cols = nc;
  tr->digest = 1;
  tr->seal_key = 0x5eed0000u + (uint64_t)s->n;
  tr->digest_offset = 8 * s->n;
  tr->perm = -1;
  *ld = *tr;
  ld->op = REFIT_DIRECT_BLOCK_QUANTIZE;
  ld->dst = (void *)(uintptr_t)(t->q_off + r0 * t->cols + c0);
  ld->dst_pitch = t->cols;
  ld->scale = (void *)(uintptr_t)(t->s_off + ((r0 / 128) * t->s_cols + c0 / 128) * 4);
  ld->scale_pitch = t->s_cols * 4;
  ld->fp8_scale = s->mode;
  s->n++;
}

static inline void dbs_fill(uint16_t *v, int64_t rows, int64_t cols,
                            int64_t pitch_elems) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) {
      const int64_t block = (r / 128) * 7 + c / 128;
      uint16_t x = kt_rand_bf16();
      if (block % 5 == 1)
        x = 0; /* an all-zero block */
      else if (block % 5 == 3)
        x = (uint16_t)((x & 0x807f) | 0x0080); /* tiny: the smallest normal exponent */
      else if (block % 5 == 4 && c % 17 == 0)
        x = (uint16_t)((x & 0x807f) | 0x7e80); /* huge among ordinary values */
      v[r * pitch_elems + c] = x;
    }
}

/* REFIT_OK, or the reference quantizer's error. */
static inline refit_status_t dbs_create(dbs_t *s, int mode) {
  memset(s, 0, sizeof(*s));
  s->mode = mode;
  const int64_t shape[DBS_TENSORS][2] = {{300, 384}, {200, 392}};
  int64_t su = 0, du = 0;
  for (int i = 0; i < DBS_TENSORS; i++) {
    dbs_tensor_t *t = &s->t[i];
    t->rows = shape[i][0];
    t->cols = shape[i][1];
    t->src_pitch = 2 * (t->cols + 8 * kt_rand_range(1, 4));
    t->src_off = (su + 15) / 16 * 16 + 2 * kt_rand_range(0, 3);
    su = t->src_off + t->rows * t->src_pitch;
    t->s_cols = refit_fp8_block_count(t->cols);
    t->q_off = (du + 15) / 16 * 16;
    t->s_off = (t->q_off + t->rows * t->cols + 15) / 16 * 16;
    du = t->s_off + refit_fp8_block_count(t->rows) * t->s_cols * 4;
  }
  s->src_bytes = su;
  s->dst_bytes = du;
  s->src = malloc((size_t)su);
  s->init = malloc((size_t)du);
  s->want = malloc((size_t)du);
  kt_fill_bytes(s->src, (size_t)su);
  kt_fill_bytes(s->init, (size_t)du);
  memcpy(s->want, s->init, (size_t)du);
  for (int i = 0; i < DBS_TENSORS; i++) {
    dbs_tensor_t *t = &s->t[i];
    uint16_t *v = (uint16_t *)(void *)(s->src + t->src_off);
    dbs_fill(v, t->rows, t->cols, t->src_pitch / 2);
    const refit_status_t st = refit_fp8_block_quantize(
        v, t->rows, t->cols, t->src_pitch / 2, (refit_fp8_scale_t)mode,
        s->want + t->q_off, t->cols, (float *)(void *)(s->want + t->s_off), t->s_cols);
    if (st != REFIT_OK)
      return st;
  }
  /* Tensor 0: block rows 0 and 1 cut at random multiples of 128 columns,
   * the partial block row whole; tensor 1 whole. */
  const int64_t band = 128 * kt_rand_range(1, 2); /* one or two block rows a chunk */
  for (int64_t r0 = 0; r0 < 256; r0 += band) {
    int64_t c0 = 0;
    while (c0 < 384) {
      int64_t nc = 128 * kt_rand_range(1, 3);
      if (c0 + nc > 384)
        nc = 384 - c0;
      dbs_chunk(s, 0, r0, band, c0, nc);
      c0 += nc;
    }
  }
  dbs_chunk(s, 0, 256, 44, 0, 384);
  dbs_chunk(s, 1, 0, 200, 0, 392);
  for (int64_t i = s->n - 1; i > 0; i--) {
    const int64_t j = kt_rand_range(0, i);
    refit_direct_desc_t a = s->trainer[i], b = s->land[i];
    s->trainer[i] = s->trainer[j];
    s->land[i] = s->land[j];
    s->trainer[j] = a;
    s->land[j] = b;
  }
  for (int64_t i = 0; i < s->n; i++)
    s->trainer[i].digest_offset = s->land[i].digest_offset = 8 * i;
  s->digest_bytes = 8 * s->n;
  refit_direct_number_blocks(s->land, s->n);
  return REFIT_OK;
}

/* Offsets in the pointer fields -> pointers into the arenas src and dst. */
static inline void dbs_bind(refit_direct_desc_t *d, int64_t n, const uint8_t *src,
                            uint8_t *dst) {
  for (int64_t i = 0; i < n; i++) {
    d[i].src = src + (uintptr_t)d[i].src;
    if (d[i].op == REFIT_DIRECT_BLOCK_QUANTIZE) {
      d[i].dst = dst + (uintptr_t)d[i].dst;
      d[i].scale = dst + (uintptr_t)d[i].scale;
    }
  }
}

static inline void dbs_destroy(dbs_t *s) {
  free(s->src);
  free(s->init);
  free(s->want);
}

#endif /* REFIT_TESTS_KERNELS_DIRECT_BLOCK_SCENARIO_H */

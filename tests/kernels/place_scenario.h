/*
 * Runtime tensors of every layout kind the data path lands, for the place
 * tests (host and GPU; kernels/place.h): a case's storage and its place, a
 * random chunk of it, wire versions of the chunk, and the lander that fills
 * it the normal way (refit_land_rows into the canonical assembly, then the
 * tensor's layout transform; block FP8: refit_land_rows' BLOCK_SPLIT straight
 * into weight and weight_scale_inv), the reference the places are checked
 * against. Include after cmocka.h.
 */
#ifndef REFIT_TESTS_KERNELS_PLACE_SCENARIO_H
#define REFIT_TESTS_KERNELS_PLACE_SCENARIO_H

#include "core/digest.h"
#include "kernels/datapath.h"
#include "kernels/layout.h"
#include "kernels/place.h"
#include "kernels_test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef enum { CASE_BF16, CASE_DENSE, CASE_MOE, CASE_BLOCK } case_kind_t;

typedef struct {
  const char *name;
  case_kind_t kind;
  refit_kernels_dense_backend_t backend; /* CASE_DENSE */
  refit_kernels_moe_tensor_t which;      /* CASE_MOE */
  int64_t n, k;                          /* dense / BF16 / block FP8 [n, k] */
  refit_kernels_moe_shape_t moe;         /* CASE_MOE */
  int64_t matrices;                      /* CASE_BLOCK: stacked matrices (0: 1) */
} place_case_t;

/* Block FP8 scale rows and columns of [n, k] in `e` matrices. */
static inline int64_t block_scale_rows(int64_t e, int64_t n) {
  return e * ((n / e + 127) / 128);
}
static inline int64_t block_scale_cols(int64_t k) { return (k + 127) / 128; }

/* A case's runtime tensor: storage (weight then scale) and its place. */
typedef struct {
  int64_t rows, cols, wbytes, sbytes;
  uint8_t *canon; /* the canonical assembly the lander fills */
  uint8_t *store;
  refit_place_tensor_t t;
} place_tensor_t;

static inline void tensor_make(const place_case_t *pc, place_tensor_t *x) {
  memset(x, 0, sizeof(*x));
  if (pc->kind == CASE_MOE) {
    refit_kernels_moe_sizes_t sz;
    int64_t m = 0;
    refit_kernels_perm_kind_t kind = REFIT_KERNELS_PERM_SRC32;
    assert_int_equal(refit_kernels_moe_check_shape(&pc->moe, pc->name, &sz), REFIT_OK);
    assert_true(refit_kernels_moe_tensor_dims(&pc->moe, pc->which, &m, &x->cols, &kind));
    x->rows = pc->moe.num_experts * m;
    x->wbytes = pc->which == REFIT_KERNELS_MOE_W13 ? sz.w13_weight : sz.w2_weight;
    x->sbytes =
        pc->which == REFIT_KERNELS_MOE_W13 ? sz.w13_weight_scale : sz.w2_weight_scale;
  } else if (pc->kind == CASE_BLOCK) {
    x->rows = pc->n;
    x->cols = pc->k;
    x->wbytes = x->rows * x->cols;
    x->sbytes = block_scale_rows(pc->matrices ? pc->matrices : 1, pc->n) *
                block_scale_cols(pc->k) * 4;
  } else {
    x->rows = pc->n;
    x->cols = pc->k;
    x->wbytes = x->rows * x->cols * 2;
    if (pc->kind == CASE_DENSE)
      assert_int_equal(refit_kernels_dense_sizes(pc->backend, x->rows, x->cols,
                                                 &x->wbytes, &x->sbytes),
                       REFIT_OK);
  }
  x->canon = calloc((size_t)(x->rows * x->cols + x->rows * (x->cols / 32)), 1);
  x->store = calloc((size_t)(x->wbytes + x->sbytes), 1);
  assert_non_null(x->canon);
  assert_non_null(x->store);
  if (pc->kind == CASE_BF16)
    assert_int_equal(refit_place_bf16_tensor(x->rows, x->cols, x->store, &x->t),
                     REFIT_OK);
  else if (pc->kind == CASE_DENSE)
    assert_int_equal(refit_place_dense_tensor(pc->backend, x->rows, x->cols, x->store,
                                              x->store + x->wbytes, &x->t),
                     REFIT_OK);
  else if (pc->kind == CASE_BLOCK)
    assert_int_equal(refit_place_fp8_block_tensor(pc->matrices ? pc->matrices : 1,
                                                  x->rows, x->cols, x->store,
                                                  x->store + x->wbytes, &x->t),
                     REFIT_OK);
  else
    assert_int_equal(refit_place_moe_tensor(&pc->moe, pc->which, x->store,
                                            x->store + x->wbytes, &x->t),
                     REFIT_OK);
}

static inline void tensor_free(place_tensor_t *x) {
  free(x->canon);
  free(x->store);
}

/* A random rectangle of the tensor: TP/EP slices land at any row and at
 * column offsets of whole blocks; block FP8 chunks are whole 128 x 128
 * blocks of one matrix (a partial one at its end). */
static inline void random_chunk(const place_tensor_t *x, refit_place_chunk_t *c) {
  if (x->t.kind == REFIT_PLACE_FP8_BLOCK) {
    const int64_t m = x->rows / x->t.matrices, e = kt_rand_range(0, x->t.matrices - 1);
    const int64_t nbr = (m + 127) / 128, nbc = (x->cols + 127) / 128;
    const int64_t r0 = kt_rand_range(0, nbr - 1), r1 = kt_rand_range(r0 + 1, nbr);
    const int64_t c0 = kt_rand_range(0, nbc - 1), c1 = kt_rand_range(c0 + 1, nbc);
    const int64_t rows = (r1 * 128 < m ? r1 * 128 : m) - r0 * 128;
    const int64_t cols = (c1 * 128 < x->cols ? c1 * 128 : x->cols) - c0 * 128;
    assert_int_equal(refit_place_chunk(&x->t, e * m + r0 * 128, c0 * 128, rows, cols, c),
                     REFIT_OK);
    return;
  }
  const int64_t unit = x->t.kind == REFIT_PLACE_MXFP8 ? 32 : 1;
  const int64_t row0 = kt_rand_range(0, x->rows - 1);
  const int64_t rows = kt_rand_range(1, x->rows - row0);
  const int64_t col0 = unit * kt_rand_range(0, x->cols / unit - 1);
  const int64_t cols = unit * kt_rand_range(1, (x->cols - col0) / unit);
  assert_int_equal(refit_place_chunk(&x->t, row0, col0, rows, cols, c), REFIT_OK);
}

/* Land the chunk's wire rows `wire` the normal way: refit_land_rows as the
 * generator's loader describes a chunk, then the tensor's layout transform. */
static inline void land(const place_case_t *pc, place_tensor_t *x,
                        const refit_place_chunk_t *c, const uint8_t *wire) {
  const int64_t rows = x->rows, cols = x->cols, kb = cols / 32;
  refit_land_desc_t d = {0};
  d.rows = c->rows;
  d.cols = c->cols;
  d.row_bytes = c->row_bytes;
  if (pc->kind == CASE_BLOCK) { /* as the loader describes it (loader.c) */
    const int64_t e = c->t->matrices, m = rows / e, sc = block_scale_cols(cols);
    const int64_t srow =
        block_scale_rows(e, rows) / e * (c->row0 / m) + c->row0 % m / 128;
    d.op = REFIT_CHUNK_BLOCK_SPLIT;
    d.dst = x->store + c->row0 * cols + c->col0;
    d.dst_pitch = cols;
    d.scale = x->store + x->wbytes + (srow * sc + c->col0 / 128) * 4;
    d.scale_pitch = sc * 4;
  } else if (pc->kind != CASE_BF16) {
    d.op = REFIT_CHUNK_SPLIT;
    d.dst = x->canon + c->row0 * cols + c->col0;
    d.dst_pitch = cols;
    d.scale = x->canon + rows * cols + c->row0 * kb + c->col0 / 32;
    d.scale_pitch = kb;
  } else {
    d.op = REFIT_CHUNK_COPY;
    d.dst = x->store + (c->row0 * cols + c->col0) * 2;
    d.dst_pitch = cols * 2;
  }
  int64_t bad = 0;
  assert_int_equal(refit_land_rows(&d, 1, 0, wire, &bad), REFIT_OK);
  assert_int_equal(bad, -1);
  if (pc->kind == CASE_DENSE)
    assert_int_equal(refit_kernels_dense_transform(pc->backend, rows, cols, x->canon,
                                                   x->canon + rows * cols, x->store,
                                                   x->store + x->wbytes),
                     REFIT_OK);
  else if (pc->kind == CASE_MOE)
    assert_int_equal(refit_kernels_moe_transform_tensor(&pc->moe, pc->which, x->canon,
                                                        x->canon + rows * cols, x->store,
                                                        x->store + x->wbytes),
                     REFIT_OK);
}

/* Give every block FP8 wire row of the chunk's rows `wire` the scale slots of
 * its block row's first row (the wire format, kernels/datapath.h); other
 * kinds have no repeats. */
static inline void repeat_scales(const refit_place_chunk_t *c, uint8_t *wire) {
  const int64_t len = c->rows * c->row_bytes;
  for (int64_t off = 0; off < len; off++)
    if (refit_place_repeat(c, off))
      wire[off] = wire[off - (off / c->row_bytes % 128) * c->row_bytes];
}

/* Two versions of the chunk's rows (len bytes each, consistent wire rows):
 * a random, then b with a random fraction `density` of a's bytes changed.
 * Returns the bytes that change and have a place of their own (repeats left
 * out: refit_place_delta_t.changed). */
static inline uint64_t make_versions(const refit_place_chunk_t *c, uint8_t *a, uint8_t *b,
                                     double density) {
  const size_t len = (size_t)(c->rows * c->row_bytes);
  kt_fill_bytes(a, len);
  repeat_scales(c, a);
  memcpy(b, a, len);
  for (size_t i = 0; i < len; i++)
    if ((double)(kt_rand() >> 11) / 9007199254740992.0 < density)
      b[i] ^= (uint8_t)kt_rand_range(1, 255);
  repeat_scales(c, b);
  uint64_t changed = 0;
  for (size_t i = 0; i < len; i++)
    changed += a[i] != b[i] && !refit_place_repeat(c, (int64_t)i);
  return changed;
}

/* The sealed trailer of rows `rows` (len bytes) under seal `seal`. */
static inline uint64_t trailer_of(const uint8_t *rows, int64_t len, uint64_t seal) {
  return refit_digest64(rows, (size_t)len) + seal;
}

static inline void put_trailer(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static const place_case_t ps_cases[] = {
    {"bf16", CASE_BF16, 0, 0, 77, 96, {0}, 0},
    {"dense cutlass",
     CASE_DENSE,
     REFIT_KERNELS_DENSE_FLASHINFER_CUTLASS,
     0,
     200,
     96,
     {0},
     0},
    {"dense cutedsl",
     CASE_DENSE,
     REFIT_KERNELS_DENSE_FLASHINFER_CUTEDSL,
     0,
     130,
     64,
     {0},
     0},
    {"dense trtllm",
     CASE_DENSE,
     REFIT_KERNELS_DENSE_FLASHINFER_TRTLLM,
     0,
     200,
     256,
     {0},
     0},
    {"moe w13", CASE_MOE, 0, REFIT_KERNELS_MOE_W13, 0, 0, {3, 128, 64, 1}, 0},
    {"moe w2", CASE_MOE, 0, REFIT_KERNELS_MOE_W2, 0, 0, {3, 256, 192, 1}, 0},
    {"moe w13 not gated", CASE_MOE, 0, REFIT_KERNELS_MOE_W13, 0, 0, {2, 128, 128, 0}, 0},
    /* A partial last block row; a partial last block column; experts of two
     * block rows each, the second partial (scale rows per expert). */
    {"block fp8", CASE_BLOCK, 0, 0, 300, 384, {0}, 1},
    {"block fp8 partial cols", CASE_BLOCK, 0, 0, 256, 320, {0}, 1},
    {"block fp8 experts", CASE_BLOCK, 0, 0, 3 * 200, 256, {0}, 3},
};

#define PS_NCASES (sizeof(ps_cases) / sizeof(ps_cases[0]))

#endif /* REFIT_TESTS_KERNELS_PLACE_SCENARIO_H */

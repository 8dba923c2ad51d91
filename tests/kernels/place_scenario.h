/*
 * Runtime tensors of every layout kind the data path lands, for the place
 * tests (host and GPU; kernels/place.h): a case's storage and its place, a
 * random chunk of it, and the lander that fills it the normal way
 * (refit_land_rows into the canonical assembly, then the tensor's layout
 * transform), the reference the places are checked against. Include after
 * cmocka.h.
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

typedef enum { CASE_BF16, CASE_DENSE, CASE_MOE } case_kind_t;

typedef struct {
  const char *name;
  case_kind_t kind;
  refit_kernels_dense_backend_t backend; /* CASE_DENSE */
  refit_kernels_moe_tensor_t which;      /* CASE_MOE */
  int64_t n, k;                          /* dense / BF16 [n, k] */
  refit_kernels_moe_shape_t moe;         /* CASE_MOE */
} place_case_t;

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
 * column offsets of whole blocks. */
static inline void random_chunk(const place_tensor_t *x, refit_place_chunk_t *c) {
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
  if (pc->kind != CASE_BF16) {
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

/* The sealed trailer of rows `rows` (len bytes) under seal `seal`. */
static inline uint64_t trailer_of(const uint8_t *rows, int64_t len, uint64_t seal) {
  return refit_digest64(rows, (size_t)len) + seal;
}

static inline void put_trailer(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static const place_case_t ps_cases[] = {
    {"bf16", CASE_BF16, 0, 0, 77, 96, {0}},
    {"dense cutlass",
     CASE_DENSE,
     REFIT_KERNELS_DENSE_FLASHINFER_CUTLASS,
     0,
     200,
     96,
     {0}},
    {"dense cutedsl",
     CASE_DENSE,
     REFIT_KERNELS_DENSE_FLASHINFER_CUTEDSL,
     0,
     130,
     64,
     {0}},
    {"dense trtllm", CASE_DENSE, REFIT_KERNELS_DENSE_FLASHINFER_TRTLLM, 0, 200, 256, {0}},
    {"moe w13", CASE_MOE, 0, REFIT_KERNELS_MOE_W13, 0, 0, {3, 128, 64, 1}},
    {"moe w2", CASE_MOE, 0, REFIT_KERNELS_MOE_W2, 0, 0, {3, 256, 192, 1}},
    {"moe w13 not gated", CASE_MOE, 0, REFIT_KERNELS_MOE_W13, 0, 0, {2, 128, 128, 0}},
};

#define PS_NCASES (sizeof(ps_cases) / sizeof(ps_cases[0]))

#endif /* REFIT_TESTS_KERNELS_PLACE_SCENARIO_H */

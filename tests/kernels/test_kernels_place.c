/*
 * Chunk byte places (kernels/place.h), checked against the lander, not
 * against the mapper's own formulas: a random chunk of every layout kind the
 * data path lands (BF16 linear; MXFP8 dense flashinfer_cutlass,
 * flashinfer_cutedsl and flashinfer_trtllm; MoE w13 gated and w2, several
 * experts) is landed the normal way (refit_land_rows into the canonical
 * assembly, then the tensor's layout transform), into storage that held
 * zeros, from wire bytes that are never zero. Then for every wire byte of the
 * chunk's rows the mapper's address holds that byte, no two wire bytes share
 * an address, the runs it reports are consecutive places, and every other
 * runtime byte is still zero (the lander wrote nothing the mapper does not
 * name). Each case runs with several random chunks and fills.
 */
#include "kernels/datapath.h"
#include "kernels/layout.h"
#include "kernels/place.h"
#include "kernels_test.h"

#include "refit/status.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */

#define ROUNDS 6

typedef enum { CASE_BF16, CASE_DENSE, CASE_MOE } case_kind_t;

typedef struct {
  const char *name;
  case_kind_t kind;
  refit_kernels_dense_backend_t backend; /* CASE_DENSE */
  refit_kernels_moe_tensor_t which;      /* CASE_MOE */
  int64_t n, k;                          /* dense / BF16 [n, k] */
  refit_kernels_moe_shape_t moe;         /* CASE_MOE */
} place_case_t;

/* One random chunk of case `pc`, landed and checked. */
static void check_case(const place_case_t *pc) {
  int64_t rows = 0, cols = 0, wbytes = 0, sbytes = 0;
  if (pc->kind == CASE_MOE) {
    refit_kernels_moe_sizes_t sz;
    int64_t m = 0;
    refit_kernels_perm_kind_t kind = REFIT_KERNELS_PERM_SRC32;
    assert_int_equal(refit_kernels_moe_check_shape(&pc->moe, pc->name, &sz), REFIT_OK);
    assert_true(refit_kernels_moe_tensor_dims(&pc->moe, pc->which, &m, &cols, &kind));
    rows = pc->moe.num_experts * m;
    wbytes = pc->which == REFIT_KERNELS_MOE_W13 ? sz.w13_weight : sz.w2_weight;
    sbytes = pc->which == REFIT_KERNELS_MOE_W13 ? sz.w13_weight_scale : sz.w2_weight_scale;
  } else {
    rows = pc->n;
    cols = pc->k;
    wbytes = rows * cols * 2;
    if (pc->kind == CASE_DENSE)
      assert_int_equal(refit_kernels_dense_sizes(pc->backend, rows, cols, &wbytes, &sbytes),
                       REFIT_OK);
  }
  const int mx = pc->kind != CASE_BF16;
  const int64_t kb = cols / 32, unit = mx ? 32 : 1;
  uint8_t *canon = calloc((size_t)(rows * cols + rows * kb), 1);
  uint8_t *store = calloc((size_t)(wbytes + sbytes), 1);
  uint8_t *seen = calloc((size_t)(wbytes + sbytes), 1);
  assert_non_null(canon);
  assert_non_null(store);
  assert_non_null(seen);
  refit_place_tensor_t t;
  if (pc->kind == CASE_BF16)
    assert_int_equal(refit_place_bf16_tensor(rows, cols, store, &t), REFIT_OK);
  else if (pc->kind == CASE_DENSE)
    assert_int_equal(refit_place_dense_tensor(pc->backend, rows, cols, store,
                                              store + wbytes, &t),
                     REFIT_OK);
  else
    assert_int_equal(refit_place_moe_tensor(&pc->moe, pc->which, store, store + wbytes, &t),
                     REFIT_OK);

  /* A random rectangle: TP/EP slices land at any row and at column offsets
   * of whole blocks. */
  const int64_t row0 = kt_rand_range(0, rows - 1);
  const int64_t crows = kt_rand_range(1, rows - row0);
  const int64_t col0 = unit * kt_rand_range(0, cols / unit - 1);
  const int64_t ccols = unit * kt_rand_range(1, (cols - col0) / unit);
  refit_place_chunk_t c;
  assert_int_equal(refit_place_chunk(&t, row0, col0, crows, ccols, &c), REFIT_OK);
  const int64_t len = crows * c.row_bytes;
  uint8_t *wire = malloc((size_t)len + 8);
  assert_non_null(wire);
  for (int64_t i = 0; i < len + 8; i++)
    wire[i] = (uint8_t)kt_rand_range(1, 255);

  /* The lander, as the generator's loader describes a chunk. */
  refit_land_desc_t d = {0};
  d.src_offset = 0;
  d.rows = crows;
  d.cols = ccols;
  d.row_bytes = c.row_bytes;
  if (mx) {
    d.op = REFIT_CHUNK_SPLIT;
    d.dst = canon + row0 * cols + col0;
    d.dst_pitch = cols;
    d.scale = canon + rows * cols + row0 * kb + col0 / 32;
    d.scale_pitch = kb;
  } else {
    d.op = REFIT_CHUNK_COPY;
    d.dst = store + (row0 * cols + col0) * 2;
    d.dst_pitch = cols * 2;
  }
  int64_t bad = 0;
  assert_int_equal(refit_land_rows(&d, 1, 0, wire, &bad), REFIT_OK);
  assert_int_equal(bad, -1);
  if (pc->kind == CASE_DENSE)
    assert_int_equal(refit_kernels_dense_transform(pc->backend, rows, cols, canon,
                                                   canon + rows * cols, store,
                                                   store + wbytes),
                     REFIT_OK);
  else if (pc->kind == CASE_MOE)
    assert_int_equal(refit_kernels_moe_transform_tensor(&pc->moe, pc->which, canon,
                                                        canon + rows * cols, store,
                                                        store + wbytes),
                     REFIT_OK);

  for (int64_t off = 0; off < len; off++) {
    int64_t run = 0;
    uint8_t *at = refit_place_addr(&c, off, &run);
    const int64_t a = at - store;
    if (a < 0 || a >= wbytes + sbytes)
      fail_msg("%s: wire byte %lld (chunk rows %lld+%lld cols %lld+%lld) maps outside "
               "the tensor (offset %lld of %lld)",
               pc->name, (long long)off, (long long)row0, (long long)crows,
               (long long)col0, (long long)ccols, (long long)a,
               (long long)(wbytes + sbytes));
    if (*at != wire[off])
      fail_msg("%s: wire byte %lld (chunk rows %lld+%lld cols %lld+%lld) is 0x%02x, "
               "its place (offset %lld) holds 0x%02x",
               pc->name, (long long)off, (long long)row0, (long long)crows,
               (long long)col0, (long long)ccols, wire[off], (long long)a, *at);
    if (seen[a]++)
      fail_msg("%s: two wire bytes map to offset %lld", pc->name, (long long)a);
    if (run < 1 || off + run > len || off / c.row_bytes != (off + run - 1) / c.row_bytes)
      fail_msg("%s: wire byte %lld: run of %lld leaves its row", pc->name, (long long)off,
               (long long)run);
    for (int64_t i = 1; i < run; i++)
      if (refit_place_addr(&c, off + i, NULL) != at + i)
        fail_msg("%s: wire byte %lld: run of %lld, byte %lld not consecutive", pc->name,
                 (long long)off, (long long)run, (long long)i);
  }
  for (int64_t a = 0; a < wbytes + sbytes; a++)
    if (!seen[a] && store[a] != 0)
      fail_msg("%s: the lander wrote offset %lld (0x%02x), which no wire byte maps to",
               pc->name, (long long)a, store[a]);
  free(wire);
  free(seen);
  free(store);
  free(canon);
}

static const place_case_t cases[] = {
    {"bf16", CASE_BF16, 0, 0, 77, 96, {0}},
    {"dense cutlass", CASE_DENSE, REFIT_KERNELS_DENSE_FLASHINFER_CUTLASS, 0, 200, 96, {0}},
    {"dense cutedsl", CASE_DENSE, REFIT_KERNELS_DENSE_FLASHINFER_CUTEDSL, 0, 130, 64, {0}},
    {"dense trtllm", CASE_DENSE, REFIT_KERNELS_DENSE_FLASHINFER_TRTLLM, 0, 200, 256, {0}},
    {"moe w13", CASE_MOE, 0, REFIT_KERNELS_MOE_W13, 0, 0, {3, 128, 64, 1}},
    {"moe w2", CASE_MOE, 0, REFIT_KERNELS_MOE_W2, 0, 0, {3, 256, 192, 1}},
    {"moe w13 not gated", CASE_MOE, 0, REFIT_KERNELS_MOE_W13, 0, 0, {2, 128, 128, 0}},
};

static void test_place_against_lander(void **state) {
  (void)state;
  kt_seed("test_place_against_lander");
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    for (int r = 0; r < ROUNDS; r++)
      check_case(&cases[i]);
    printf("  %s: %d random chunks, every byte at its place\n", cases[i].name, ROUNDS);
  }
}

/* Chunks that leave the tensor or split a scale block are refused. */
static void test_place_refuses(void **state) {
  (void)state;
  uint8_t w[64 * 64], s[128 * 4];
  refit_place_tensor_t t;
  refit_place_chunk_t c;
  assert_int_equal(refit_place_dense_tensor(REFIT_KERNELS_DENSE_FLASHINFER_CUTLASS, 64, 64,
                                            w, s, &t),
                   REFIT_OK);
  assert_int_equal(refit_place_chunk(&t, 0, 0, 64, 64, &c), REFIT_OK);
  assert_int_equal(c.row_bytes, 66);
  assert_int_equal(refit_place_chunk(&t, 1, 0, 64, 64, &c), REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_place_chunk(&t, 0, 16, 8, 32, &c), REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_place_chunk(&t, 0, 0, 8, 48, &c), REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_place_bf16_tensor(8, 8, NULL, &t), REFIT_ERR_INVALID_ARGUMENT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_place_against_lander),
      cmocka_unit_test(test_place_refuses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

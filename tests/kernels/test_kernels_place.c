/*
 * Chunk byte places (kernels/place.h), checked against the lander, not
 * against the mapper's own formulas: a random chunk of every layout kind the
 * data path lands (BF16 linear; MXFP8 dense flashinfer_cutlass,
 * flashinfer_cutedsl and flashinfer_trtllm; MoE w13 gated and w2, several
 * experts; block FP8 prequantized on the trainer, partial block rows and
 * columns, several matrices) is landed the normal way (refit_land_rows into
 * the canonical assembly, then the tensor's layout transform; block FP8's
 * BLOCK_SPLIT straight into weight and weight_scale_inv), into storage that
 * held zeros, from wire bytes that are never zero. Then for every wire byte
 * of the chunk's rows the mapper's address holds that byte, no two wire
 * bytes share an address (but a block FP8 scale's repeats, which share the
 * address of their block row's first row), the runs it reports are
 * consecutive places, and every other runtime byte is still zero (the lander
 * wrote nothing the mapper does not name). Each case runs with several
 * random chunks and fills. Then deltas applied through the places
 * (refit_place_delta_check and _write), also against the lander: see
 * test_place_delta.
 */
#include "core/digest.h"
#include "kernels/datapath.h"
#include "kernels/delta.h"
#include "kernels/layout.h"
#include "kernels/place.h"
#include "kernels_test.h"

#include "refit/status.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */

#include "place_scenario.h"

#define ROUNDS 6

/* One random chunk of case `pc`, landed and checked. */
static void check_case(const place_case_t *pc) {
  place_tensor_t x;
  tensor_make(pc, &x);
  const int64_t total = x.wbytes + x.sbytes;
  uint8_t *store = x.store;
  uint8_t *seen = calloc((size_t)total, 1);
  assert_non_null(seen);
  refit_place_chunk_t c;
  random_chunk(&x, &c);
  const int64_t len = c.rows * c.row_bytes;
  uint8_t *wire = malloc((size_t)len + 8);
  assert_non_null(wire);
  for (int64_t i = 0; i < len + 8; i++)
    wire[i] = (uint8_t)kt_rand_range(1, 255);
  repeat_scales(&c, wire);
  land(pc, &x, &c, wire);
  int64_t repeats = 0;

  for (int64_t off = 0; off < len; off++) {
    int64_t run = 0;
    uint8_t *at = refit_place_addr(&c, off, &run);
    const int64_t a = at - store;
    if (a < 0 || a >= total)
      fail_msg("%s: wire byte %lld (chunk rows %lld+%lld cols %lld+%lld) maps outside "
               "the tensor (offset %lld of %lld)",
               pc->name, (long long)off, (long long)c.row0, (long long)c.rows,
               (long long)c.col0, (long long)c.cols, (long long)a, (long long)total);
    if (*at != wire[off])
      fail_msg("%s: wire byte %lld (chunk rows %lld+%lld cols %lld+%lld) is 0x%02x, "
               "its place (offset %lld) holds 0x%02x",
               pc->name, (long long)off, (long long)c.row0, (long long)c.rows,
               (long long)c.col0, (long long)c.cols, wire[off], (long long)a, *at);
    if (refit_place_repeat(&c, off)) {
      /* The same byte of the first row of its block row. */
      const int64_t first = off - (off / c.row_bytes % 128) * c.row_bytes;
      if (refit_place_repeat(&c, first) || refit_place_addr(&c, first, NULL) != at)
        fail_msg("%s: repeat wire byte %lld is not at the place of byte %lld", pc->name,
                 (long long)off, (long long)first);
      repeats++;
    } else if (seen[a]++) {
      fail_msg("%s: two wire bytes map to offset %lld", pc->name, (long long)a);
    }
    if (run < 1 || off + run > len || off / c.row_bytes != (off + run - 1) / c.row_bytes)
      fail_msg("%s: wire byte %lld: run of %lld leaves its row", pc->name, (long long)off,
               (long long)run);
    for (int64_t i = 1; i < run; i++)
      if (refit_place_addr(&c, off + i, NULL) != at + i)
        fail_msg("%s: wire byte %lld: run of %lld, byte %lld not consecutive", pc->name,
                 (long long)off, (long long)run, (long long)i);
  }
  for (int64_t a = 0; a < total; a++)
    if (!seen[a] && store[a] != 0)
      fail_msg("%s: the lander wrote offset %lld (0x%02x), which no wire byte maps to",
               pc->name, (long long)a, store[a]);
  /* Repeats: every scale byte of a row that does not start a block row. */
  const int64_t slot_bytes = c.row_bytes - c.cols;
  if (repeats != (x.t.kind == REFIT_PLACE_FP8_BLOCK
                      ? (c.rows - (c.rows + 127) / 128) * slot_bytes
                      : 0))
    fail_msg("%s: %lld repeat bytes", pc->name, (long long)repeats);
  free(wire);
  free(seen);
  tensor_free(&x);
}

/*
 * Deltas through the places, against the lander: a chunk landed as version
 * A, then version B (A with a random fraction of its bytes changed, block FP8
 * scales in every row of their block row, the trailer resealed) applied
 * through the places from each encoding and from the whole span. check
 * writes nothing, gives the changed row bytes (repeats left out), the new
 * trailer and the digest of B's rows (computed from A's digest and the
 * touched words only); write then leaves exactly what landing B the normal
 * way leaves. A flipped bit anywhere in the delta after its header is caught,
 * by check or by the digest (the new trailer against the new sum and seal);
 * a positions or mask delta applied to storage that holds B already is
 * refused by the baseline rule.
 */
static void check_delta_case(const place_case_t *pc, double density) {
  place_tensor_t x, ref;
  tensor_make(pc, &x);
  tensor_make(pc, &ref);
  const int64_t total = x.wbytes + x.sbytes;
  refit_place_chunk_t c;
  random_chunk(&x, &c);
  refit_place_chunk_t rc = c;
  rc.t = &ref.t;
  const int64_t len = c.rows * c.row_bytes, span = len + 8;
  uint8_t *a = malloc((size_t)span), *b = malloc((size_t)span);
  uint8_t *start = malloc((size_t)total), *after_b = malloc((size_t)total);
  const size_t cap = 16 + 5 * (size_t)span;
  uint8_t *delta = malloc(cap);
  assert_non_null(a);
  assert_non_null(b);
  assert_non_null(start);
  assert_non_null(after_b);
  assert_non_null(delta);
  const uint64_t changed = make_versions(&c, a, b, density);
  const uint64_t seal_a = kt_rand(), seal_b = kt_rand();
  const uint64_t trailer_a = trailer_of(a, len, seal_a);
  const uint64_t trailer_b = trailer_of(b, len, seal_b);
  put_trailer(a + len, trailer_a);
  put_trailer(b + len, trailer_b);
  land(pc, &x, &c, a);
  memcpy(start, x.store, (size_t)total);
  land(pc, &ref, &rc, b);
  memcpy(after_b, ref.store, (size_t)total);
  const uint64_t sum_a = refit_digest64(a, (size_t)len), sum_b = refit_digest64(b, (size_t)len);

  for (int e = REFIT_DELTA_POSITIONS; e <= REFIT_DELTA_DENSE + 1; e++) {
    const int full = e > REFIT_DELTA_DENSE;
    const uint8_t *bytes = b;
    size_t dlen = (size_t)span;
    if (!full) {
      assert_int_equal(refit_delta_encode(b, a, (size_t)span, (refit_delta_encoding_t)e,
                                          delta, cap, &dlen, NULL),
                       REFIT_OK);
      bytes = delta;
    }
    memcpy(x.store, start, (size_t)total);
    refit_place_delta_t r;
    assert_int_equal(refit_place_delta_check(&c, 8, sum_a, trailer_a, bytes, dlen, full, &r),
                     REFIT_OK);
    assert_memory_equal(x.store, start, (size_t)total);
    assert_int_equal(r.changed, changed);
    assert_int_equal(r.sum, sum_b);
    assert_int_equal(r.trailer, trailer_b);
    uint64_t written = 0;
    uint8_t **undo_at = malloc((size_t)(changed + 1) * sizeof(*undo_at));
    uint8_t *undo_old = malloc((size_t)changed + 1);
    assert_non_null(undo_at);
    assert_non_null(undo_old);
    assert_int_equal(
        refit_place_delta_write(&c, 8, bytes, dlen, full, undo_at, undo_old, &written),
        REFIT_OK);
    assert_int_equal(written, changed);
    if (memcmp(x.store, after_b, (size_t)total) != 0)
      fail_msg("%s, %s: storage after the delta differs from landing version B",
               pc->name, full ? "whole span" : refit_delta_encoding_name(e));
    /* The undo log takes storage back to A. */
    for (uint64_t u = written; u-- > 0;)
      *undo_at[u] = undo_old[u];
    assert_memory_equal(x.store, start, (size_t)total);
    free(undo_at);
    free(undo_old);
    assert_int_equal(refit_place_delta_write(&c, 8, bytes, dlen, full, NULL, NULL, &written),
                     REFIT_OK);
    assert_memory_equal(x.store, after_b, (size_t)total);

    /* The same delta again, on storage that holds B: made against A. */
    if (!full && e != REFIT_DELTA_DENSE && changed > 0)
      assert_int_equal(refit_place_delta_check(&c, 8, sum_b, trailer_b, bytes, dlen, 0, &r),
                       REFIT_ERR_INTEGRITY);

    /* A flipped bit after the header, on storage holding A. */
    if (full || dlen <= REFIT_DELTA_HEADER_BYTES)
      continue;
    memcpy(x.store, start, (size_t)total);
    const size_t at = (size_t)kt_rand_range(REFIT_DELTA_HEADER_BYTES, (int64_t)dlen - 1);
    delta[at] ^= (uint8_t)(1u << kt_rand_range(0, 7));
    const refit_status_t st =
        refit_place_delta_check(&c, 8, sum_a, trailer_a, delta, dlen, 0, &r);
    if (st == REFIT_OK && r.trailer == r.sum + seal_b)
      fail_msg("%s, %s: a flipped bit at delta byte %zu of %zu passed check and digest",
               pc->name, refit_delta_encoding_name(e), at, dlen);
    assert_memory_equal(x.store, start, (size_t)total);
  }
  free(a);
  free(b);
  free(start);
  free(after_b);
  free(delta);
  tensor_free(&x);
  tensor_free(&ref);
}

static void test_place_against_lander(void **state) {
  (void)state;
  kt_seed("test_place_against_lander");
  for (size_t i = 0; i < PS_NCASES; i++) {
    for (int r = 0; r < ROUNDS; r++)
      check_case(&ps_cases[i]);
    printf("  %s: %d random chunks, every byte at its place\n", ps_cases[i].name, ROUNDS);
  }
}

static void test_place_delta(void **state) {
  (void)state;
  kt_seed("test_place_delta");
  static const double densities[] = {0, 1e-3, 1e-2, 0.2, 1};
  for (size_t i = 0; i < PS_NCASES; i++) {
    for (size_t d = 0; d < sizeof(densities) / sizeof(densities[0]); d++)
      for (int r = 0; r < 3; r++)
        check_delta_case(&ps_cases[i], densities[d]);
    printf("  %s: deltas of every encoding and whole spans, %d chunks per density\n",
           ps_cases[i].name, 3);
  }
}

/* Chunks that leave the tensor or split a scale block are refused. */
static void test_place_refuses(void **state) {
  (void)state;
  uint8_t w[300 * 320], s[128 * 4];
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
  /* Block FP8, two matrices of 150 x 320 (scale 2 x 2 each): whole blocks of
   * one matrix, ending on a block or at the matrix's last row / column. */
  assert_int_equal(refit_place_fp8_block_tensor(2, 300, 320, w, s, &t), REFIT_OK);
  assert_int_equal(refit_place_chunk(&t, 150, 128, 150, 192, &c), REFIT_OK);
  assert_int_equal(c.row_bytes, 192 + 8);
  assert_int_equal(refit_place_chunk(&t, 0, 0, 128, 128, &c), REFIT_OK);
  assert_int_equal(refit_place_chunk(&t, 64, 0, 64, 128, &c), REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_place_chunk(&t, 128, 0, 64, 128, &c),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_place_chunk(&t, 0, 0, 64, 128, &c), REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_place_chunk(&t, 0, 64, 128, 128, &c),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_place_chunk(&t, 0, 0, 128, 192, &c), REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_place_fp8_block_tensor(2, 301, 320, w, s, &t),
                   REFIT_ERR_INVALID_ARGUMENT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_place_against_lander),
      cmocka_unit_test(test_place_delta),
      cmocka_unit_test(test_place_refuses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

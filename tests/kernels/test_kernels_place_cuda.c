/*
 * Deltas applied through their places on a GPU (kernels/place_cuda.h),
 * against the lander and the C reference (kernels/place.h): batches of
 * chunks of every layout kind (one per tensor, several tensors a call, three
 * of them large enough for many tiles of every walk; block FP8's scale
 * repeats written by their block row's first row only), each landed as
 * version A, then given version B (A with a random fraction of its bytes
 * changed, the trailer resealed) as a positions, mask or dense delta or as
 * the whole span, at random misaligned offsets of one device buffer. The
 * check writes nothing and gives, per chunk, the changed row bytes, the
 * digest change and the new trailer that the C check gives (and that make
 * B's digest and trailer); the write leaves every tensor exactly as landing
 * B the normal way does, logs one undo entry per written byte, and the undo
 * takes every tensor back to A. Then single chunks that must be refused: a
 * positions or mask delta on storage holding B already (the baseline rule),
 * positions out of order or past the span, a flipped bit anywhere after the
 * header (refused by the check or by the digest), a truncated delta (by the
 * tiles, on the host). Exits 77 (skipped) without a GPU.
 */
#include "kernels/delta.h"
#include "kernels/delta_cuda.h"
#include "kernels/place_cuda.h"
#include "kernels_test.h"

#include "refit/status.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */

#include "place_scenario.h"

#define CK(call) assert_int_equal((int)(call), (int)cudaSuccess)

/* Three more cases, large enough for several tiles of every walk. */
static const place_case_t big_cases[] = {
    {"bf16 large", CASE_BF16, 0, 0, 1024, 1536, {0}, 0},
    {"dense trtllm large",
     CASE_DENSE,
     REFIT_KERNELS_DENSE_FLASHINFER_TRTLLM,
     0,
     1100,
     1024,
     {0},
     0},
    {"block fp8 large", CASE_BLOCK, 0, 0, 2 * 550, 1000, {0}, 2},
};

static const place_case_t *case_at(size_t i) {
  return i < PS_NCASES ? &ps_cases[i] : &big_cases[i - PS_NCASES];
}
#define NALL (PS_NCASES + sizeof(big_cases) / sizeof(big_cases[0]))

/* One chunk of a batch: its tensor on the host (A landed) and on the GPU,
 * B landed the normal way, and what to apply. */
typedef struct {
  const place_case_t *pc;
  place_tensor_t x, ref;
  int64_t total;
  uint8_t *start, *after_b, *dev; /* A's storage, B's, the GPU's copy */
  refit_place_chunk_t c;
  int64_t len, span;
  uint64_t sum_a, sum_b, trailer_a, trailer_b, changed;
  int enc; /* refit_delta_encoding_t, or 0: the whole span */
  uint8_t *bytes;
  size_t blen;
  size_t at; /* offset in the batch's buffer */
} item_t;

static double pick_density(void) {
  static const double d[] = {0, 1e-4, 1e-3, 1e-2, 0.2, 1};
  return d[kt_rand_range(0, 5)];
}

static void item_make(item_t *it, const place_case_t *pc, int enc, double density) {
  memset(it, 0, sizeof(*it));
  it->pc = pc;
  it->enc = enc;
  tensor_make(pc, &it->x);
  tensor_make(pc, &it->ref);
  it->total = it->x.wbytes + it->x.sbytes;
  random_chunk(&it->x, &it->c);
  refit_place_chunk_t rc = it->c;
  rc.t = &it->ref.t;
  it->len = it->c.rows * it->c.row_bytes;
  it->span = it->len + 8;
  uint8_t *a = malloc((size_t)it->span), *b = malloc((size_t)it->span);
  assert_non_null(a);
  assert_non_null(b);
  it->changed = make_versions(&it->c, a, b, density);
  const uint64_t seal_a = kt_rand(), seal_b = kt_rand();
  it->sum_a = refit_digest64(a, (size_t)it->len);
  it->sum_b = refit_digest64(b, (size_t)it->len);
  it->trailer_a = it->sum_a + seal_a;
  it->trailer_b = it->sum_b + seal_b;
  put_trailer(a + it->len, it->trailer_a);
  put_trailer(b + it->len, it->trailer_b);
  land(pc, &it->x, &it->c, a);
  land(pc, &it->ref, &rc, b);
  it->start = malloc((size_t)it->total);
  it->after_b = malloc((size_t)it->total);
  assert_non_null(it->start);
  assert_non_null(it->after_b);
  memcpy(it->start, it->x.store, (size_t)it->total);
  memcpy(it->after_b, it->ref.store, (size_t)it->total);
  if (enc == 0) {
    it->bytes = b;
    it->blen = (size_t)it->span;
  } else {
    const size_t cap = 16 + 5 * (size_t)it->span;
    it->bytes = malloc(cap);
    assert_non_null(it->bytes);
    assert_int_equal(refit_delta_encode(b, a, (size_t)it->span,
                                        (refit_delta_encoding_t)enc, it->bytes, cap,
                                        &it->blen, NULL),
                     REFIT_OK);
    free(b);
  }
  free(a);
  CK(cudaMalloc((void **)&it->dev, (size_t)it->total));
  CK(cudaMemcpy(it->dev, it->start, (size_t)it->total, cudaMemcpyHostToDevice));
}

static void item_free(item_t *it) {
  tensor_free(&it->x);
  tensor_free(&it->ref);
  free(it->start);
  free(it->after_b);
  free(it->bytes);
  CK(cudaFree(it->dev));
}

static const char *enc_name(int enc) {
  return enc == 0 ? "whole span" : refit_delta_encoding_name((refit_delta_encoding_t)enc);
}

/* The GPU's storage of item it equals `want`? */
static void expect_dev(const item_t *it, const uint8_t *want, const char *when) {
  uint8_t *got = malloc((size_t)it->total);
  assert_non_null(got);
  CK(cudaMemcpy(got, it->dev, (size_t)it->total, cudaMemcpyDeviceToHost));
  for (int64_t i = 0; i < it->total; i++)
    if (got[i] != want[i])
      fail_msg("%s, %s (chunk rows %lld+%lld cols %lld+%lld): %s: storage byte %lld is "
               "0x%02x, expected 0x%02x",
               it->pc->name, enc_name(it->enc), (long long)it->c.row0,
               (long long)it->c.rows, (long long)it->c.col0, (long long)it->c.cols, when,
               (long long)i, got[i], want[i]);
  free(got);
}

/* A batch on the GPU: the chunk table, tiles, outputs, error key and the
 * deltas, all in device memory. */
typedef struct {
  int64_t n, ntiles;
  uint8_t *buf; /* the deltas */
  refit_place_cuda_chunk_t *chunks;
  refit_place_cuda_tile_t *tiles;
  refit_place_cuda_out_t *outs;
  unsigned long long *err;
  refit_place_cuda_chunk_t *h;
} batch_t;

/* Upload items[0..n) as a batch; returns the host status of the tiles. */
static refit_status_t batch_make(batch_t *bt, item_t *items, int64_t n) {
  memset(bt, 0, sizeof(*bt));
  bt->n = n;
  size_t bytes = 0;
  for (int64_t i = 0; i < n; i++) {
    bytes += (size_t)kt_rand_range(0, 15); /* misaligned at random */
    items[i].at = bytes;
    bytes += items[i].blen;
  }
  CK(cudaMalloc((void **)&bt->buf, bytes + 1));
  bt->h = calloc((size_t)n, sizeof(*bt->h));
  assert_non_null(bt->h);
  int64_t ntiles = 0;
  refit_status_t st = REFIT_OK;
  for (int64_t i = 0; i < n; i++) {
    item_t *it = &items[i];
    CK(cudaMemcpy(bt->buf + it->at, it->bytes, it->blen, cudaMemcpyHostToDevice));
    refit_place_tensor_t t = it->x.t;
    t.values = it->dev + (it->x.t.values - it->x.store);
    if (t.scales != NULL)
      t.scales = it->dev + (it->x.t.scales - it->x.store);
    bt->h[i] = (refit_place_cuda_chunk_t){t,
                                          it->c.row0,
                                          it->c.col0,
                                          it->c.rows,
                                          it->c.cols,
                                          it->c.row_bytes,
                                          bt->buf + it->at,
                                          it->blen,
                                          it->enc == 0,
                                          8,
                                          it->trailer_a};
    int64_t nt = 0;
    if (st == REFIT_OK)
      st = refit_place_cuda_tiles(&bt->h[i], i, it->bytes, NULL, &nt);
    ntiles += nt;
  }
  if (st != REFIT_OK)
    return st;
  refit_place_cuda_tile_t *tiles = calloc((size_t)(ntiles ? ntiles : 1), sizeof(*tiles));
  assert_non_null(tiles);
  for (int64_t i = 0, at = 0; i < n; i++) {
    int64_t nt = 0;
    assert_int_equal(
        refit_place_cuda_tiles(&bt->h[i], i, items[i].bytes, tiles + at, &nt), REFIT_OK);
    at += nt;
  }
  bt->ntiles = ntiles;
  CK(cudaMalloc((void **)&bt->chunks, (size_t)n * sizeof(*bt->chunks)));
  CK(cudaMalloc((void **)&bt->tiles, (size_t)(ntiles ? ntiles : 1) * sizeof(*tiles)));
  CK(cudaMalloc((void **)&bt->outs, (size_t)n * sizeof(*bt->outs)));
  CK(cudaMalloc((void **)&bt->err, sizeof(*bt->err)));
  CK(cudaMemcpy(bt->chunks, bt->h, (size_t)n * sizeof(*bt->h), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(bt->tiles, tiles, (size_t)ntiles * sizeof(*tiles),
                cudaMemcpyHostToDevice));
  free(tiles);
  return REFIT_OK;
}

static void batch_reset(batch_t *bt) {
  refit_place_cuda_out_t *o = calloc((size_t)bt->n, sizeof(*o));
  assert_non_null(o);
  for (int64_t i = 0; i < bt->n; i++)
    o[i].trailer = bt->h[i].old_trailer;
  CK(cudaMemcpy(bt->outs, o, (size_t)bt->n * sizeof(*o), cudaMemcpyHostToDevice));
  CK(cudaMemset(bt->err, 0xff, sizeof(*bt->err)));
  free(o);
}

/* Check the batch: the error key (UINT64_MAX: none) and the outputs. */
static unsigned long long batch_check(batch_t *bt, refit_place_cuda_out_t *outs) {
  batch_reset(bt);
  assert_int_equal(
      refit_place_check_cuda(bt->chunks, bt->tiles, bt->ntiles, bt->outs, bt->err, 0),
      REFIT_OK);
  unsigned long long key = 0;
  CK(cudaMemcpy(&key, bt->err, sizeof(key), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(outs, bt->outs, (size_t)bt->n * sizeof(*outs), cudaMemcpyDeviceToHost));
  return key;
}

static void batch_free(batch_t *bt) {
  CK(cudaFree(bt->buf));
  CK(cudaFree(bt->chunks));
  CK(cudaFree(bt->tiles));
  CK(cudaFree(bt->outs));
  CK(cudaFree(bt->err));
  free(bt->h);
}

/* A batch of one chunk per case, every encoding and the whole span. */
static void check_batch(void) {
  const int64_t n = (int64_t)NALL;
  item_t *items = calloc((size_t)n, sizeof(*items));
  assert_non_null(items);
  const int first = (int)kt_rand_range(0, 3);
  for (int64_t i = 0; i < n; i++)
    item_make(&items[i], case_at((size_t)i), (int)((first + i) % 4), pick_density());
  batch_t bt;
  assert_int_equal(batch_make(&bt, items, n), REFIT_OK);
  refit_place_cuda_out_t *outs = calloc((size_t)n, sizeof(*outs));
  assert_non_null(outs);
  assert_true(batch_check(&bt, outs) == ~0ull);
  uint64_t total = 0;
  for (int64_t i = 0; i < n; i++) {
    item_t *it = &items[i];
    expect_dev(it, it->start, "after the check");
    /* The C reference on the host copy holding A. */
    refit_place_delta_t r;
    assert_int_equal(refit_place_delta_check(&it->c, 8, it->sum_a, it->trailer_a,
                                             it->bytes, it->blen, it->enc == 0, &r),
                     REFIT_OK);
    if (outs[i].changed != r.changed || it->sum_a + outs[i].sum != r.sum ||
        outs[i].trailer != r.trailer)
      fail_msg("%s, %s: GPU check gives %llu changed, digest %016llx, trailer %016llx; "
               "the C check %llu, %016llx, %016llx",
               it->pc->name, enc_name(it->enc), (unsigned long long)outs[i].changed,
               (unsigned long long)(it->sum_a + outs[i].sum),
               (unsigned long long)outs[i].trailer, (unsigned long long)r.changed,
               (unsigned long long)r.sum, (unsigned long long)r.trailer);
    assert_int_equal(r.changed, it->changed);
    assert_int_equal(r.sum, it->sum_b);
    assert_int_equal(r.trailer, it->trailer_b);
    total += it->changed;
  }
  /* Write with an undo log, then undo, then write without one. */
  uint64_t *undo_at = NULL;
  uint8_t *undo_old = NULL;
  unsigned long long *next = NULL, got = 0;
  CK(cudaMalloc((void **)&undo_at, 8 * (size_t)(total + 1)));
  CK(cudaMalloc((void **)&undo_old, (size_t)(total + 1)));
  CK(cudaMalloc((void **)&next, sizeof(*next)));
  CK(cudaMemset(next, 0, sizeof(*next)));
  assert_int_equal(refit_place_write_cuda(bt.chunks, bt.tiles, bt.ntiles, bt.outs,
                                          undo_at, undo_old, next, 0),
                   REFIT_OK);
  CK(cudaMemcpy(outs, bt.outs, (size_t)n * sizeof(*outs), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(&got, next, sizeof(got), cudaMemcpyDeviceToHost));
  assert_int_equal(got, total);
  for (int64_t i = 0; i < n; i++) {
    assert_int_equal(outs[i].written, items[i].changed);
    expect_dev(&items[i], items[i].after_b, "after the write (landing B)");
  }
  assert_int_equal(refit_place_undo_cuda(undo_at, undo_old, (int64_t)total, 0), REFIT_OK);
  for (int64_t i = 0; i < n; i++)
    expect_dev(&items[i], items[i].start, "after the undo");
  assert_true(batch_check(&bt, outs) == ~0ull);
  assert_int_equal(refit_place_write_cuda(bt.chunks, bt.tiles, bt.ntiles, bt.outs, NULL,
                                          NULL, NULL, 0),
                   REFIT_OK);
  for (int64_t i = 0; i < n; i++)
    expect_dev(&items[i], items[i].after_b, "after the write without a log");
  printf("  batch of %lld chunks, %lld tiles, %llu changed bytes: as the C reference\n",
         (long long)n, (long long)bt.ntiles, (unsigned long long)total);
  CK(cudaFree(undo_at));
  CK(cudaFree(undo_old));
  CK(cudaFree(next));
  free(outs);
  batch_free(&bt);
  for (int64_t i = 0; i < n; i++)
    item_free(&items[i]);
  free(items);
}

static uint32_t get_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

static void set_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

/* One chunk's batch is refused with `reason` (0: any, by the check or by the
 * digest), writing nothing. */
static void expect_refused(item_t *it, int reason, const char *what) {
  batch_t bt;
  const refit_status_t st = batch_make(&bt, it, 1);
  if (st != REFIT_OK) { /* refused on the host: the delta's shape */
    assert_int_equal(st, REFIT_ERR_INTEGRITY);
    if (reason != 0)
      fail_msg("%s, %s: %s: refused by the tiles, expected the check's reason %d",
               it->pc->name, enc_name(it->enc), what, reason);
    CK(cudaFree(bt.buf));
    free(bt.h);
    return;
  }
  refit_place_cuda_out_t out;
  const unsigned long long key = batch_check(&bt, &out);
  const uint64_t seal_b = it->trailer_b - it->sum_b;
  const int digest_ok = out.trailer == it->sum_a + out.sum + seal_b;
  if (key == ~0ull && digest_ok)
    fail_msg("%s, %s: %s passed the check and the digest", it->pc->name,
             enc_name(it->enc), what);
  if (reason != 0 && (key == ~0ull || (int)(key >> 32 & 0xff) != reason))
    fail_msg("%s, %s: %s: check key %llx, expected reason %d", it->pc->name,
             enc_name(it->enc), what, key, reason);
  int64_t chunk = -2;
  if (key != ~0ull) {
    assert_int_equal(refit_place_cuda_report(key, &chunk), REFIT_ERR_INTEGRITY);
    assert_int_equal(chunk, 0);
  }
  expect_dev(it, it->start, what);
  batch_free(&bt);
}

static void check_refusals(const place_case_t *pc) {
  for (int enc = REFIT_DELTA_POSITIONS; enc <= REFIT_DELTA_DENSE; enc++) {
    item_t it;
    item_make(&it, pc, enc, 0.01);
    if (it.changed == 0 || it.blen <= REFIT_DELTA_HEADER_BYTES) {
      item_free(&it);
      continue;
    }
    uint8_t *keep = malloc(it.blen);
    assert_non_null(keep);
    memcpy(keep, it.bytes, it.blen);
    /* A flipped bit after the header. */
    const size_t at =
        (size_t)kt_rand_range(REFIT_DELTA_HEADER_BYTES, (int64_t)it.blen - 1);
    it.bytes[at] ^= (uint8_t)(1u << kt_rand_range(0, 7));
    expect_refused(&it, 0, "a flipped bit");
    memcpy(it.bytes, keep, it.blen);
    const uint32_t count = get_u32(it.bytes + 12);
    if (enc == REFIT_DELTA_POSITIONS && count >= 2) {
      uint8_t *p = it.bytes + REFIT_DELTA_HEADER_BYTES;
      const uint32_t j = (uint32_t)kt_rand_range(1, count - 1);
      const uint32_t o0 = get_u32(p + 4 * (j - 1)), o1 = get_u32(p + 4 * j);
      set_u32(p + 4 * (j - 1), o1);
      set_u32(p + 4 * j, o0);
      expect_refused(&it, REFIT_DELTA_CUDA_POS_ORDER, "positions out of order");
      memcpy(it.bytes, keep, it.blen);
      set_u32(p + 4 * (count - 1), (uint32_t)it.span);
      expect_refused(&it, REFIT_DELTA_CUDA_POS_RANGE, "a position past the span");
      memcpy(it.bytes, keep, it.blen);
    }
    if (enc != REFIT_DELTA_DENSE) { /* made against A, applied to B */
      CK(cudaMemcpy(it.dev, it.after_b, (size_t)it.total, cudaMemcpyHostToDevice));
      memcpy(it.start, it.after_b, (size_t)it.total);
      it.trailer_a = it.trailer_b;
      it.sum_a = it.sum_b;
      expect_refused(&it,
                     enc == REFIT_DELTA_POSITIONS ? REFIT_DELTA_CUDA_POS_SAME
                                                  : REFIT_DELTA_CUDA_BLOCK_SAME,
                     "a delta against other bytes");
    }
    /* Truncated: refused on the host, by the tiles. */
    it.blen--;
    batch_t bt;
    assert_int_equal(batch_make(&bt, &it, 1), REFIT_ERR_INTEGRITY);
    CK(cudaFree(bt.buf));
    free(bt.h);
    it.blen++;
    free(keep);
    item_free(&it);
  }
}

static void test_place_cuda_batches(void **state) {
  (void)state;
  for (int r = 0; r < 8; r++)
    check_batch();
}

static void test_place_cuda_refusals(void **state) {
  (void)state;
  for (size_t i = 0; i < NALL; i++) {
    check_refusals(case_at(i));
    printf("  %s: refused as it should be, nothing written\n", case_at(i)->name);
  }
}

int main(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("no GPU: skipped\n");
    return 77;
  }
  kt_seed("test_kernels_place_cuda");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_place_cuda_batches),
      cmocka_unit_test(test_place_cuda_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

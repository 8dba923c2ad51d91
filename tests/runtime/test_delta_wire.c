/*
 * Delta frames (runtime/src/session/delta_wire.h): a message's chunks encoded against
 * its baseline and applied to a copy of that baseline give the new message
 * bit for bit, at every density, pattern and cut of the message into chunks;
 * every malformed frame is REFIT_ERR_INTEGRITY naming what is wrong; random
 * corruptions never write outside the message. Fresh random inputs each run
 * (the seed is printed; REFIT_TEST_SEED repeats one).
 */
#include "session/delta_wire.h"
#include "device/memory.h"

#include "core/error.h"
#include "kernels/delta.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

static uint64_t rng_state;

static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static int setup(void **state) {
  (void)state;
  const char *env = getenv("REFIT_TEST_SEED");
  rng_state =
      env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)clock() << 20;
  if (rng_state == 0)
    rng_state = 1;
  printf("test_delta_wire: seed %llu (REFIT_TEST_SEED repeats it)\n",
         (unsigned long long)rng_state);
  return 0;
}

/* A message of `bytes` cut into n chunks at random places (spans[0] = 0,
 * spans[n] = bytes, empty chunks allowed). */
static int64_t random_spans(int64_t bytes, int64_t *span, int64_t max_chunks) {
  const int64_t n = 1 + (int64_t)(rng() % (uint64_t)max_chunks);
  span[0] = 0;
  for (int64_t i = 1; i < n; i++)
    span[i] = bytes ? (int64_t)(rng() % (uint64_t)(bytes + 1)) : 0;
  span[n] = bytes;
  for (int64_t i = 1; i < n; i++) /* insertion sort of the cuts */
    for (int64_t j = i; j > 1 && span[j - 1] > span[j]; j--) {
      const int64_t t = span[j];
      span[j] = span[j - 1];
      span[j - 1] = t;
    }
  return n;
}

/* new = base with a fraction p of its bytes changed: scattered bytes, or
 * runs of 1 to 64 bytes. */
static void change(const unsigned char *base, unsigned char *now, int64_t bytes, double p,
                   int runs) {
  memcpy(now, base, (size_t)bytes);
  int64_t want = (int64_t)(p * (double)bytes + 0.5);
  while (want > 0 && bytes > 0) {
    const int64_t at = (int64_t)(rng() % (uint64_t)bytes);
    const int64_t len = runs ? 1 + (int64_t)(rng() % 64) : 1;
    for (int64_t i = at; i < at + len && i < bytes && want > 0; i++, want--)
      now[i] = (unsigned char)(base[i] + 1 + rng() % 255);
  }
}

typedef struct {
  int64_t bytes, n;
  int64_t span[33];
  unsigned char *base, *now, *frame, *dst;
  size_t len;
} msg_t;

static void msg_make(msg_t *m, int64_t bytes, double p, int runs) {
  m->bytes = bytes;
  m->n = random_spans(bytes, m->span, 32);
  m->base = malloc((size_t)bytes + 1);
  m->now = malloc((size_t)bytes + 1);
  m->dst = malloc((size_t)bytes + 64); /* 32 guard bytes on each side */
  m->frame = malloc(refit_dw_frame_bound(bytes, m->n));
  assert_non_null(m->base);
  assert_non_null(m->now);
  assert_non_null(m->dst);
  assert_non_null(m->frame);
  for (int64_t i = 0; i < bytes; i++)
    m->base[i] = (unsigned char)rng();
  change(m->base, m->now, bytes, p, runs);
  assert_int_equal(
      refit_dw_frame_encode(m->now, m->base, m->span, m->n, m->frame, &m->len), REFIT_OK);
  assert_true(m->len <= refit_dw_frame_bound(bytes, m->n));
}

/* dst's message bytes := the baseline, guards := 0xa5. */
static unsigned char *msg_reset(msg_t *m) {
  memset(m->dst, 0xa5, (size_t)m->bytes + 64);
  memcpy(m->dst + 32, m->base, (size_t)m->bytes);
  return m->dst + 32;
}

static void assert_guards(const msg_t *m) {
  for (int i = 0; i < 32; i++) {
    assert_int_equal(m->dst[i], 0xa5);
    assert_int_equal(m->dst[32 + m->bytes + i], 0xa5);
  }
}

static void msg_free(msg_t *m) {
  free(m->base);
  free(m->now);
  free(m->dst);
  free(m->frame);
}

static void test_round_trips(void **state) {
  (void)state;
  static const double density[] = {0, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 1};
  for (size_t d = 0; d < sizeof(density) / sizeof(density[0]); d++)
    for (int runs = 0; runs < 2; runs++)
      for (int rep = 0; rep < 6; rep++) {
        msg_t m;
        const int64_t bytes = rep == 0 ? 0 : (int64_t)(rng() % (256 * 1024));
        msg_make(&m, bytes, density[d], runs);
        unsigned char *dst = msg_reset(&m);
        assert_int_equal(refit_dw_frame_apply(m.frame, m.len, dst, m.span, m.n, "test"),
                         REFIT_OK);
        assert_memory_equal(dst, m.now, (size_t)bytes);
        assert_guards(&m);
        /* Nothing changed: each chunk is its 4-byte length and a 16-byte
         * delta header. */
        if (density[d] == 0)
          assert_int_equal(m.len, REFIT_DW_HEADER_BYTES +
                                      (size_t)m.n * (4 + REFIT_DELTA_HEADER_BYTES));
        /* Sparse changes: far below the message (a trainer sends the frame
         * only when it is shorter). */
        if (density[d] == 1e-3 && !runs && bytes >= 65536)
          assert_true(m.len < (size_t)bytes / 50);
        msg_free(&m);
      }
}

/* Apply `frame` (len bytes) to m's baseline: REFIT_ERR_INTEGRITY whose
 * message contains `want`. */
static void expect_bad(msg_t *m, const unsigned char *frame, size_t len,
                       const char *want) {
  unsigned char *dst = msg_reset(m);
  refit_status_t st = refit_dw_frame_apply(frame, len, dst, m->span, m->n, "bucket 3");
  assert_int_equal(st, REFIT_ERR_INTEGRITY);
  const char *msg = refit_last_error();
  if (strstr(msg, want) == NULL || strstr(msg, "bucket 3") == NULL)
    fail_msg("error '%s' lacks '%s' or the message's name", msg, want);
  assert_guards(m);
}

static void test_malformed(void **state) {
  (void)state;
  msg_t m;
  msg_make(&m, 65536 + (int64_t)(rng() % 65536), 1e-3, 0);
  unsigned char *bad = malloc(m.len + 8);
  assert_non_null(bad);

  memcpy(bad, m.frame, m.len);
  bad[0] ^= 1;
  expect_bad(&m, bad, m.len, "neither the full message");
  expect_bad(&m, m.frame, 8, "neither the full message");

  memcpy(bad, m.frame, m.len);
  bad[4] ^= 1; /* chunk count */
  expect_bad(&m, bad, m.len, "chunks");

  /* Shorter than its header says (a truncated message). */
  expect_bad(&m, m.frame, m.len - 1, "the received length");

  /* A chunk length past the frame's end. */
  memcpy(bad, m.frame, m.len);
  bad[REFIT_DW_HEADER_BYTES + 3] = 0x7f;
  expect_bad(&m, bad, m.len, "runs past the frame");

  /* Bytes after the last chunk, the header agreeing. */
  memcpy(bad, m.frame, m.len);
  bad[m.len] = 0;
  const uint64_t longer = m.len + 1;
  for (int i = 0; i < 8; i++)
    bad[8 + i] = (unsigned char)(longer >> (8 * i));
  expect_bad(&m, bad, m.len + 1, "after its last chunk");

  /* Made against another baseline: the new bytes applied again (every
   * position already holds its byte). */
  unsigned char *dst = msg_reset(&m);
  memcpy(dst, m.now, (size_t)m.bytes);
  refit_status_t st = refit_dw_frame_apply(m.frame, m.len, dst, m.span, m.n, "bucket 3");
  assert_int_equal(st, REFIT_ERR_INTEGRITY);
  assert_non_null(strstr(refit_last_error(), "chunk"));
  free(bad);
  msg_free(&m);
}

/* Random corruptions: refused or applied, never a write outside the
 * message. */
static void test_corruptions(void **state) {
  (void)state;
  int refused = 0;
  for (int rep = 0; rep < 2000; rep++) {
    msg_t m;
    msg_make(&m, 1 + (int64_t)(rng() % 8192), rep % 2 ? 1e-2 : 0.3, rep % 3 == 0);
    const size_t at = (size_t)(rng() % m.len);
    m.frame[at] ^= (unsigned char)(1 + rng() % 255);
    unsigned char *dst = msg_reset(&m);
    refit_status_t st = refit_dw_frame_apply(m.frame, m.len, dst, m.span, m.n, "fuzz");
    assert_true(st == REFIT_OK || st == REFIT_ERR_INTEGRITY);
    refused += st != REFIT_OK;
    assert_guards(&m);
    msg_free(&m);
  }
  /* A flipped header, length or offset is refused; a flipped payload byte
   * may apply (the chunk digests over the rebuilt bytes catch it). */
  assert_true(refused > 0);
}

/* A trainer's baseline brought up to the new bytes by the deltas it made
 * (refit_mem_delta_encode, then refit_mem_delta_apply), on host memory and,
 * where a GPU is visible, on device memory with the baseline in GPU memory
 * and in pinned host memory: the baseline equals the new bytes, bit for
 * bit; applying the same deltas again is refused and writes nothing. */
static void mem_delta_round_trip(int device, int pinned) {
  refit_mem_t *mem = NULL;
  assert_int_equal(refit_mem_create(device, &mem), REFIT_OK);
  enum { N = 24 };
  refit_mem_delta_t ch[N];
  uint64_t lens[N];
  int64_t size[N], at[N + 1];
  uint64_t off = 0;
  at[0] = 0;
  for (int i = 0; i < N; i++) {
    size[i] = i == 0 ? 0 : (int64_t)(rng() % 70000);
    at[i + 1] = at[i] + size[i];
  }
  const size_t total = (size_t)at[N];
  unsigned char *base_h = malloc(total + 1), *now_h = malloc(total + 1),
                *got = malloc(total + 1);
  assert_non_null(base_h);
  assert_non_null(now_h);
  assert_non_null(got);
  for (size_t i = 0; i < total; i++)
    base_h[i] = (unsigned char)rng();
  for (int i = 0; i < N; i++) { /* densities from none to every byte */
    static const double p[] = {0.0, 1e-4, 1e-3, 1e-2, 0.1, 0.3, 1.0};
    change(base_h + at[i], now_h + at[i], size[i], p[i % 7], i % 2);
  }
  unsigned char *base = NULL, *now = NULL, *out = NULL;
  size_t out_bytes = 0;
  for (int i = 0; i < N; i++)
    out_bytes += (refit_delta_bound((uint64_t)size[i]) + 15) & ~(size_t)15;
  if (pinned)
    assert_int_equal(refit_mem_alloc_pinned(mem, total + 1, (void **)&base), REFIT_OK);
  else
    assert_int_equal(refit_mem_alloc(mem, total + 1, (void **)&base), REFIT_OK);
  assert_int_equal(refit_mem_alloc(mem, total + 1, (void **)&now), REFIT_OK);
  assert_int_equal(refit_mem_alloc(mem, out_bytes, (void **)&out), REFIT_OK);
  assert_int_equal(refit_mem_from_host(mem, base, base_h, total), REFIT_OK);
  assert_int_equal(refit_mem_from_host(mem, now, now_h, total), REFIT_OK);
  for (int i = 0; i < N; i++) {
    ch[i] = (refit_mem_delta_t){now + at[i], base + at[i], (uint64_t)size[i], off};
    off += (refit_delta_bound((uint64_t)size[i]) + 15) & ~(uint64_t)15;
  }
  assert_int_equal(refit_mem_delta_encode(mem, ch, N, out, lens), REFIT_OK);
  assert_int_equal(refit_mem_delta_apply(mem, ch, N, out, lens), REFIT_OK);
  assert_int_equal(refit_mem_sync(mem), REFIT_OK);
  assert_int_equal(refit_mem_to_host(mem, got, base, total), REFIT_OK);
  assert_memory_equal(got, now_h, total);
  /* Again: every named byte is already there, so the deltas were not made
   * against these bytes (unless nothing changed anywhere). */
  refit_status_t st = refit_mem_delta_apply(mem, ch, N, out, lens);
  assert_int_equal(st, REFIT_ERR_INTEGRITY);
  assert_non_null(strstr(refit_last_error(), "not made"));
  assert_int_equal(refit_mem_sync(mem), REFIT_OK);
  assert_int_equal(refit_mem_to_host(mem, got, base, total), REFIT_OK);
  assert_memory_equal(got, now_h, total);
  if (pinned)
    refit_mem_free_pinned(mem, base);
  else
    refit_mem_free(mem, base);
  refit_mem_free(mem, now);
  refit_mem_free(mem, out);
  refit_mem_destroy(mem);
  free(base_h);
  free(now_h);
  free(got);
}

static void test_mem_delta(void **state) {
  (void)state;
  mem_delta_round_trip(0, 0);
  if (refit_mem_gpu_count() > 0) {
    mem_delta_round_trip(1, 0);
    mem_delta_round_trip(1, 1);
  } else {
    printf("test_mem_delta: no GPU visible: host memory only\n");
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trips),
      cmocka_unit_test(test_mem_delta),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_corruptions),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}

/*
 * Delta codec (kernels/delta.h): decode(encode(new, base)) applied to base is
 * new, bit for bit, for every encoding at densities from 0 to 1, scattered
 * and clustered, on chunks of any length; the encoder's choice is the
 * smallest of the three encodings as actually written, and the sizes are the
 * format's; every malformed delta named in the format is refused with its
 * reason, and random corruptions of valid deltas either decode or are
 * refused as REFIT_ERR_INTEGRITY with the destination untouched and nothing
 * written outside it.
 */
#include "kernels/delta.h"
#include "kernels_test.h"

#include "refit/status.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */

static const double densities[] = {0, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 1};

/* new = base with `want` bytes changed (each to another value), scattered
 * (independent positions) or clustered (runs of 1 to 64 bytes). Returns the
 * number changed. */
static size_t make_change(const uint8_t *base, uint8_t *new_bytes, size_t n, size_t want,
                          int clustered) {
  memcpy(new_bytes, base, n);
  uint8_t *hit = calloc(n > 0 ? n : 1, 1);
  size_t changed = 0;
  while (changed < want) {
    const size_t start = (size_t)kt_rand_range(0, (int64_t)n - 1);
    const size_t run = clustered ? (size_t)kt_rand_range(1, 64) : 1;
    for (size_t i = start; i < n && i < start + run && changed < want; i++) {
      if (hit[i])
        continue;
      hit[i] = 1;
      new_bytes[i] = (uint8_t)(base[i] ^ (uint8_t)kt_rand_range(1, 255));
      changed++;
    }
  }
  free(hit);
  return changed;
}

/* The format's sizes, counted independently of the codec. */
static void expected_sizes(const uint8_t *a, const uint8_t *b, size_t n,
                           uint64_t size[REFIT_DELTA_ENCODINGS], uint64_t *changed,
                           uint64_t *blocks) {
  uint64_t k = 0, c = 0, block_bytes = 0;
  for (size_t b0 = 0; b0 < n; b0 += 32) {
    const size_t len = n - b0 < 32 ? n - b0 : 32;
    size_t d = 0;
    for (size_t i = 0; i < len; i++)
      d += a[b0 + i] != b[b0 + i];
    k += d;
    if (d > 0) {
      c++;
      block_bytes += len;
    }
  }
  const uint64_t nb = (n + 31) / 32;
  size[REFIT_DELTA_POSITIONS] = 16 + 5 * k;
  size[REFIT_DELTA_MASK] = 16 + (nb + 7) / 8 + block_bytes;
  size[REFIT_DELTA_DENSE] = 16 + n;
  *changed = k;
  *blocks = c;
}

/* Encode as `e`, decode onto a guarded copy of base: returns the delta's
 * length after checking that the copy became new and the guards held. */
static size_t roundtrip(const uint8_t *new_bytes, const uint8_t *base, size_t n,
                        refit_delta_encoding_t e, uint8_t *delta, size_t cap,
                        refit_delta_stats_t *st) {
  size_t len = 0;
  assert_int_equal(refit_delta_encode(new_bytes, base, n, e, delta, cap, &len, st),
                   REFIT_OK);
  uint8_t *guarded = malloc(n + 64);
  memset(guarded, 0xa5, n + 64);
  memcpy(guarded + 32, base, n);
  const refit_status_t rc = refit_delta_decode(delta, len, guarded + 32, n);
  if (rc != REFIT_OK)
    fail_msg("decode of a %s delta (%zu bytes, chunk %zu): %s",
             refit_delta_encoding_name(e), len, n, refit_last_error());
  assert_memory_equal(guarded + 32, new_bytes, n);
  for (size_t i = 0; i < 32; i++) {
    assert_int_equal(guarded[i], 0xa5);
    assert_int_equal(guarded[n + 32 + i], 0xa5);
  }
  free(guarded);
  return len;
}

static void test_delta_roundtrip(void **state) {
  (void)state;
  kt_seed("test_delta_roundtrip");
  const size_t sizes[] = {0, 1, 31, 32, 33, 255, 256, 257, 4096, 65536 + 17, 1 << 20};
  for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
    const size_t n = sizes[si];
    uint8_t *base = malloc(n + 1), *new_bytes = malloc(n + 1);
    /* Room for every encoding: positions may take five times the chunk. */
    const size_t cap = 16 + 5 * n + (n + 255) / 256;
    uint8_t *delta = malloc(cap), *chosen = malloc(cap);
    kt_fill_bytes(base, n + 1);
    for (size_t di = 0; di < sizeof(densities) / sizeof(densities[0]); di++)
      for (int clustered = 0; clustered <= 1; clustered++) {
        const size_t want = (size_t)(densities[di] * (double)n + 0.5);
        assert_int_equal(make_change(base, new_bytes, n, want, clustered), want);
        uint64_t size[REFIT_DELTA_ENCODINGS], k, c;
        expected_sizes(new_bytes, base, n, size, &k, &c);
        refit_delta_stats_t st;
        assert_int_equal(refit_delta_measure(new_bytes, base, n, &st), REFIT_OK);
        assert_int_equal(st.changed_bytes, want);
        assert_int_equal(st.changed_blocks, c);
        uint64_t smallest = UINT64_MAX;
        for (int e = REFIT_DELTA_POSITIONS; e < REFIT_DELTA_ENCODINGS; e++) {
          refit_delta_stats_t est;
          const size_t len =
              roundtrip(new_bytes, base, n, (refit_delta_encoding_t)e, delta, cap, &est);
          if (e == (int)st.best)
            memcpy(chosen, delta, len);
          assert_int_equal(len, size[e]);
          assert_int_equal(st.size[e], size[e]);
          assert_int_equal(est.changed_bytes, st.changed_bytes);
          assert_int_equal(est.changed_blocks, st.changed_blocks);
          assert_int_equal(est.best, st.best);
          assert_int_equal(est.size[REFIT_DELTA_AUTO], st.size[st.best]);
          smallest = len < smallest ? len : smallest;
        }
        /* The choice is the smallest of the three as written. */
        /* refit_delta_bound is room enough for the smallest. */
        const size_t len = roundtrip(new_bytes, base, n, REFIT_DELTA_AUTO, delta,
                                     (size_t)refit_delta_bound(n), NULL);
        assert_int_equal(len, smallest);
        /* The same bytes as the encoding forced (auto with room writes
         * positions during its comparison, a forced one in a second pass). */
        assert_memory_equal(delta, chosen, len);
        refit_delta_info_t info;
        assert_int_equal(refit_delta_info(delta, len, &info), REFIT_OK);
        assert_int_equal(info.encoding, st.best);
        assert_int_equal(size[info.encoding], smallest);
        assert_int_equal(info.chunk_bytes, n);
        if (want == 0)
          assert_int_equal(len, 16); /* an unchanged chunk costs its header */
        if (densities[di] == 1 && n >= 32)
          assert_int_equal(info.encoding, REFIT_DELTA_DENSE);
      }
    free(base);
    free(new_bytes);
    free(delta);
    free(chosen);
  }
}

/*
 * A dense stretch at the start of a large, otherwise unchanged chunk: auto
 * stops writing positions during its comparison there (they take more than a
 * mask of the blocks compared), yet positions are the smallest in the end
 * (the mask's bitmap alone is 1/256 of the chunk), so they come from the
 * second pass: the same bytes as positions forced, and they decode.
 */
static void test_delta_positions_after_dense_start(void **state) {
  (void)state;
  kt_seed("test_delta_positions_after_dense_start");
  const size_t n = (size_t)16 << 20, stretch = 16384;
  uint8_t *base = malloc(n), *new_bytes = malloc(n);
  const size_t cap = (size_t)refit_delta_bound(n);
  uint8_t *d_auto = malloc(cap), *d_pos = malloc(cap);
  kt_fill_bytes(base, n);
  memcpy(new_bytes, base, n);
  for (size_t i = 0; i < stretch; i += 2)
    new_bytes[i] = (uint8_t)(base[i] ^ (uint8_t)kt_rand_range(1, 255));
  const size_t far = (size_t)kt_rand_range((int64_t)stretch, (int64_t)n - 1);
  new_bytes[far] = (uint8_t)(base[far] ^ 0x5a);
  size_t la = 0, lp = 0;
  refit_delta_stats_t st;
  assert_int_equal(
      refit_delta_encode(new_bytes, base, n, REFIT_DELTA_AUTO, d_auto, cap, &la, &st),
      REFIT_OK);
  assert_int_equal(st.best, REFIT_DELTA_POSITIONS);
  assert_int_equal(st.changed_bytes, stretch / 2 + 1);
  assert_int_equal(refit_delta_encode(new_bytes, base, n, REFIT_DELTA_POSITIONS, d_pos,
                                      cap, &lp, NULL),
                   REFIT_OK);
  assert_int_equal(la, 16 + 5 * (stretch / 2 + 1));
  assert_int_equal(la, lp);
  assert_memory_equal(d_auto, d_pos, la);
  assert_int_equal(refit_delta_decode(d_auto, la, base, n), REFIT_OK);
  assert_memory_equal(base, new_bytes, n);
  free(base);
  free(new_bytes);
  free(d_auto);
  free(d_pos);
}

/* Whole 32-byte blocks changed (an MXFP8 block whose scale moved): the mask
 * is the smallest between its break-evens with positions and with dense. */
static void test_delta_choice_blocks(void **state) {
  (void)state;
  kt_seed("test_delta_choice_blocks");
  const size_t n = 1 << 16, nb = n / 32;
  uint8_t *base = malloc(n), *new_bytes = malloc(n), *delta = malloc(n + 16);
  kt_fill_bytes(base, n);
  /* Blocks changed: 1 (positions: 16 + 160 < 16 + 256 + 32), nb / 8 (mask:
   * 16 + 256 + n / 8 < 5 n / 8), all (dense: 16 + n < 16 + 256 + n). */
  const struct {
    size_t blocks;
    refit_delta_encoding_t want;
  } cases[] = {
      {1, REFIT_DELTA_POSITIONS}, {nb / 8, REFIT_DELTA_MASK}, {nb, REFIT_DELTA_DENSE}};
  for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
    memcpy(new_bytes, base, n);
    const size_t stride = nb / cases[ci].blocks,
                 first = (size_t)kt_rand_range(0, (int64_t)stride - 1);
    for (size_t b = first; b < nb; b += stride)
      for (size_t i = 0; i < 32; i++)
        new_bytes[b * 32 + i] ^= (uint8_t)kt_rand_range(1, 255);
    size_t len;
    refit_delta_stats_t st;
    assert_int_equal(refit_delta_encode(new_bytes, base, n, REFIT_DELTA_AUTO, delta,
                                        n + 16, &len, &st),
                     REFIT_OK);
    assert_int_equal(st.changed_blocks, cases[ci].blocks);
    assert_int_equal(st.best, cases[ci].want);
  }
  free(base);
  free(new_bytes);
  free(delta);
}

/* ---- Malformed deltas --------------------------------------------------- */

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

/* Decoding `d` (len bytes) onto a copy of base must fail with `why` and
 * leave the copy as it was. */
static void expect_refused(const uint8_t *d, size_t len, const uint8_t *base, size_t n,
                           size_t dst_bytes, const char *why) {
  uint8_t *dst = malloc(n + 1);
  memcpy(dst, base, n);
  const refit_status_t rc = refit_delta_decode(d, len, dst, dst_bytes);
  if (rc != REFIT_ERR_INTEGRITY || strstr(refit_last_error(), why) == NULL)
    fail_msg("want REFIT_ERR_INTEGRITY '%s', got %s: %s", why, refit_status_name(rc),
             refit_last_error());
  assert_memory_equal(dst, base, n);
  free(dst);
}

static void test_delta_malformed(void **state) {
  (void)state;
  kt_seed("test_delta_malformed");
  const size_t n = 1000; /* 32 blocks, the last of 8 bytes */
  uint8_t base[1000], new_bytes[1000], d[1016 + 64];
  kt_fill_bytes(base, n);
  /* Positions 10, 20 and a change in the last, short block. */
  memcpy(new_bytes, base, n);
  new_bytes[10] ^= 1;
  new_bytes[20] ^= 2;
  new_bytes[995] ^= 4;
  size_t len;
  assert_int_equal(refit_delta_encode(new_bytes, base, n, REFIT_DELTA_POSITIONS, d,
                                      sizeof(d), &len, NULL),
                   REFIT_OK);
  assert_int_equal(len, 16 + 15);
  uint8_t e[sizeof(d)];
#define MUTATE(code, elen, dst_bytes, why)                                               \
  do {                                                                                   \
    memcpy(e, d, len);                                                                   \
    code;                                                                                \
    expect_refused(e, (elen), base, n, (dst_bytes), (why));                              \
  } while (0)
  MUTATE((void)0, 15, n, "15 bytes, shorter than its 16-byte header");
  MUTATE(e[0] = 'X', len, n, "magic 0x31444658, expected 0x31444652");
  MUTATE(e[4] = 0, len, n, "encoding 0 is none of positions (1), mask (2), dense (3)");
  MUTATE(e[4] = 9, len, n, "encoding 9 is none of");
  MUTATE(e[6] = 1, len, n, "header bytes 5..7 are 00 01 00, must be zero");
  MUTATE((void)0, len, n - 1, "made for a chunk of 1000 bytes, the destination has 999");
  MUTATE((void)0, len - 1, n, "30 bytes, but its positions encoding of 3 entries");
  MUTATE((void)0, len + 1, n, "32 bytes, but its positions encoding");
  MUTATE(put_u32(e + 12, 1001), len, n, "1001 positions in a chunk of 1000 bytes");
  MUTATE(put_u32(e + 16 + 4, 5), len, n,
         "position 1 at offset 5 does not follow position 0's offset 10");
  MUTATE(put_u32(e + 16 + 4, 10), len, n, "does not follow position 0's offset 10");
  MUTATE(put_u32(e + 16 + 8, 1000), len, n, "position 2 at offset 1000, past the chunk");
  MUTATE(put_u32(e + 16 + 8, UINT32_MAX), len, n, "past the chunk's 1000 bytes");
  MUTATE(e[16 + 12 + 1] = base[20], len, n,
         "position 1 (offset 20): the destination already holds");

  /* The mask encoding of the same change: blocks 0 and 31 (8 bytes). */
  assert_int_equal(
      refit_delta_encode(new_bytes, base, n, REFIT_DELTA_MASK, d, sizeof(d), &len, NULL),
      REFIT_OK);
  assert_int_equal(len, 16 + 4 + 32 + 8);
  MUTATE(put_u32(e + 12, 3), len, n, "the mask marks 2 blocks, the header says 3");
  MUTATE(put_u32(e + 12, 33), len, n, "33 changed blocks in a chunk of 32 blocks");
  MUTATE(e[16 + 1] |= 1, len, n, "the mask marks 3 blocks, the header says 2");
  MUTATE((void)0, 19, n, "shorter than its header and the 4-byte block mask");
  MUTATE((void)0, len - 1, n, "59 bytes, but its mask encoding of 2 entries");
  /* Block 31 unmarked and block 30 marked instead: 32 bytes, not 8. */
  MUTATE(e[16 + 3] = 0x40, len, n,
         "mask encoding of 2 entries for a 1000-byte chunk takes 84");
  memcpy(e, d, len);
  memcpy(e + 16 + 4, base, 32); /* block 0's new bytes are the baseline's */
  expect_refused(e, len, base, n, n, "block 0 (bytes 0..31): the destination holds it");
  /* A chunk of 968 bytes has 31 blocks: the mark of block 31 is past it. */
  MUTATE(put_u32(e + 8, 968), len, 968, "mask bits past the chunk's 31 blocks are set");

  /* Dense: a count. */
  assert_int_equal(
      refit_delta_encode(new_bytes, base, n, REFIT_DELTA_DENSE, d, sizeof(d), &len, NULL),
      REFIT_OK);
  MUTATE(put_u32(e + 12, 1), len, n, "a dense delta with count 1, must be 0");
  MUTATE((void)0, len - 1, n, "1015 bytes, but its dense encoding");
#undef MUTATE

  /* A delta applied twice: the second finds its bytes already there. */
  assert_int_equal(
      refit_delta_encode(new_bytes, base, n, REFIT_DELTA_AUTO, d, sizeof(d), &len, NULL),
      REFIT_OK);
  uint8_t dst[1000];
  memcpy(dst, base, n);
  assert_int_equal(refit_delta_decode(d, len, dst, n), REFIT_OK);
  assert_memory_equal(dst, new_bytes, n);
  expect_refused(d, len, new_bytes, n, n, "the delta was not made against this baseline");

  /* Arguments. */
  assert_int_equal(
      refit_delta_encode(new_bytes, base, n, REFIT_DELTA_DENSE, d, 1015, &len, NULL),
      REFIT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(refit_last_error(), "the dense encoding of a 1000-byte chunk "
                                             "takes 1016 bytes, the output holds 1015"));
  assert_int_equal(refit_delta_encode(new_bytes, base, n, (refit_delta_encoding_t)7, d,
                                      sizeof(d), &len, NULL),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(
      refit_delta_encode(NULL, base, n, REFIT_DELTA_AUTO, d, sizeof(d), &len, NULL),
      REFIT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(refit_last_error(), "NULL new bytes for a chunk of 1000 bytes"));
  assert_int_equal(refit_delta_decode(d, len, NULL, n), REFIT_ERR_INVALID_ARGUMENT);
}

/* ---- Fuzz --------------------------------------------------------------- */

static void test_delta_fuzz(void **state) {
  (void)state;
  kt_seed("test_delta_fuzz");
  enum { MAXN = 300, GUARD = 64, ITERS = 60000 };
  uint8_t base[MAXN + 1], new_bytes[MAXN + 1], d[16 + 5 * MAXN + 16], e[sizeof(d) + 64];
  uint8_t buf[GUARD + MAXN + GUARD];
  int64_t refused = 0, decoded = 0;
  for (int it = 0; it < ITERS; it++) {
    const size_t n = (size_t)kt_rand_range(0, MAXN);
    kt_fill_bytes(base, n + 1);
    const double density = densities[kt_rand_range(0, 6)];
    make_change(base, new_bytes, n, (size_t)(density * (double)n + 0.5),
                (int)kt_rand_range(0, 1));
    size_t len;
    const refit_delta_encoding_t enc = (refit_delta_encoding_t)kt_rand_range(0, 3);
    assert_int_equal(
        refit_delta_encode(new_bytes, base, n, enc, d, sizeof(d), &len, NULL), REFIT_OK);
    /* Corrupt: flip bits, set bytes, truncate, extend, or rewrite a header
     * field with a random or a near value. */
    size_t elen = len;
    memcpy(e, d, len);
    const int kinds = (int)kt_rand_range(1, 3);
    for (int k = 0; k < kinds; k++) {
      switch (elen > 0 ? kt_rand_range(0, 5) : 3) {
      case 0:
        e[kt_rand_range(0, (int64_t)elen - 1)] ^= (uint8_t)(1u << kt_rand_range(0, 7));
        break;
      case 1:
        e[kt_rand_range(0, (int64_t)elen - 1)] = (uint8_t)kt_rand();
        break;
      case 2:
        elen = (size_t)kt_rand_range(0, (int64_t)elen);
        break;
      case 3: {
        const size_t grow = (size_t)kt_rand_range(1, 64);
        for (size_t i = 0; i < grow; i++)
          e[elen + i] = (uint8_t)kt_rand();
        elen += grow;
        break;
      }
      case 4:
        if (elen >= 16)
          put_u32(e + 8 + 4 * kt_rand_range(0, 1), (uint32_t)kt_rand());
        break;
      default:
        if (elen >= 16) {
          const size_t at = 8 + 4 * (size_t)kt_rand_range(0, 1);
          uint32_t v = (uint32_t)e[at] | (uint32_t)e[at + 1] << 8 |
                       (uint32_t)e[at + 2] << 16 | (uint32_t)e[at + 3] << 24;
          put_u32(e + at, v + (uint32_t)kt_rand_range(-2, 2));
        }
        break;
      }
      if (elen > sizeof(e) - 64)
        elen = sizeof(e) - 64;
    }
    memset(buf, 0x5a, sizeof(buf));
    memcpy(buf + GUARD, base, n);
    /* A destination of another size now and then too. */
    const size_t dn = kt_rand_range(0, 7) == 0 ? (size_t)kt_rand_range(0, MAXN) : n;
    if (dn != n)
      memset(buf + GUARD, 0x5a, MAXN);
    const refit_status_t rc = refit_delta_decode(e, elen, buf + GUARD, dn);
    for (size_t i = 0; i < GUARD; i++)
      if (buf[i] != 0x5a || buf[GUARD + dn + i] != 0x5a)
        fail_msg("iteration %d: decode wrote outside the %zu-byte destination", it, dn);
    if (rc == REFIT_OK) {
      decoded++;
      continue;
    }
    if (rc != REFIT_ERR_INTEGRITY)
      fail_msg("iteration %d: %s: %s", it, refit_status_name(rc), refit_last_error());
    refused++;
    if (dn == n)
      assert_memory_equal(buf + GUARD, base, n); /* untouched */
  }
  printf("  %d corrupted deltas: %lld refused, %lld decoded (a corruption that left a "
         "valid delta)\n",
         ITERS, (long long)refused, (long long)decoded);
  assert_true(refused > ITERS / 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_delta_roundtrip),
      cmocka_unit_test(test_delta_positions_after_dense_start),
      cmocka_unit_test(test_delta_choice_blocks),
      cmocka_unit_test(test_delta_malformed),
      cmocka_unit_test(test_delta_fuzz),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

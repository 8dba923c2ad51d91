/*
 * Data-path host references (kernels/datapath.h) against independent
 * expectations: pack then land returns every source row (COPY), the
 * quantization of the whole tensor (QUANTIZE -> SPLIT, COPY -> QUANTIZE,
 * BLOCK_QUANTIZE -> BLOCK_SPLIT of whole 128 x 128 blocks), the
 * wire rows and digests are where the wire format says; the digest catches a
 * flipped bit and a truncated chunk, reported as the first bad index while
 * every chunk lands (the bad one as its wire bytes say, the others intact);
 * descriptor checks name the index; synthetic values equal a direct loop.
 */
#include "datapath_scenario.h"
#include "kernels/fp8_block.h"
#include "kernels/mxfp8.h"
#include "kernels/synth_rules.h"

#include "core/digest.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */

/* The digest written out from its definition (core/digest.h), word by word,
 * byte by byte, with the halves' arithmetic done in 64 bits and reduced. */
static uint64_t slow_digest(const uint8_t *p, int64_t len) {
  uint64_t d = (uint64_t)len * REFIT_DIGEST_P1;
  for (int64_t i = 0; 8 * i < len; i++) {
    uint64_t lo = 0, hi = 0;
    for (int b = 0; b < 8 && 8 * i + b < len; b++) {
      if (b < 4)
        lo |= (uint64_t)p[8 * i + b] << (8 * b);
      else
        hi |= (uint64_t)p[8 * i + b] << (8 * (b - 4));
    }
    const uint64_t k = ((uint64_t)i * REFIT_DIGEST_K1) % 4294967296ull;
    const uint64_t a = (lo + k) % 4294967296ull;
    const uint64_t b = (hi + (k ^ REFIT_DIGEST_K2)) % 4294967296ull;
    d += a * b;
  }
  return d;
}

/* Quantize `rows` BF16 rows (any alignment) into q rows and scale rows. */
static void quantize_expected(const uint8_t *src, int64_t pitch, int64_t rows,
                              int64_t cols, uint8_t *q, int64_t q_pitch,
                              uint8_t *scale, int64_t scale_pitch) {
  uint16_t *row = malloc((size_t)cols * 2 + 2);
  for (int64_t r = 0; r < rows; r++) {
    memcpy(row, src + r * pitch, (size_t)cols * 2);
    assert_int_equal(
        refit_mxfp8_quantize_rows(row, 1, cols, cols, q + r * q_pitch, cols,
                                  scale + r * scale_pitch, cols / 32),
        REFIT_OK);
  }
  free(row);
}

/* Pack and land a random scenario on the host and check every landed byte. */
static void roundtrip(int64_t n, int digest_mode) {
  dps_t s;
  dps_create(&s, n, digest_mode);
  uint8_t *wire = malloc((size_t)s.wire_bytes),
          *dst = malloc((size_t)s.dst_bytes);
  uint8_t *want = malloc((size_t)s.dst_bytes);
  memset(wire, 0xA5, (size_t)s.wire_bytes);
  memset(dst, 0x5A, (size_t)s.dst_bytes);
  memset(want, 0x5A, (size_t)s.dst_bytes);
  refit_pack_desc_t *pack = malloc((size_t)n * sizeof(*pack));
  refit_land_desc_t *land = malloc((size_t)n * sizeof(*land));
  dps_bind(&s, s.src, dst, pack, land);
  assert_int_equal(refit_pack_rows(pack, n, dps_tag, wire), REFIT_OK);
  int64_t bad = 42;
  assert_int_equal(refit_land_rows(land, n, dps_tag, wire, &bad), REFIT_OK);
  assert_int_equal(bad, -1);
  for (int64_t i = 0; i < n; i++) {
    const refit_pack_desc_t *p = &pack[i];
    const refit_land_desc_t *l = &land[i];
    const uint8_t *src = p->src, *w = wire + p->dst_offset;
    const int64_t len = p->rows * p->row_bytes;
    if (p->digest) {
      uint64_t got = 0;
      for (int b = 0; b < 8; b++)
        got |= (uint64_t)w[len + b] << (8 * b);
      /* The seal, from its definition in core/digest.h. */
      assert_true(got == slow_digest(w, len) + p->seal_key + dps_tag * 0xD6E8FEB86659FD93ull);
    }
    uint8_t *wq = want + ((uint8_t *)l->dst - dst);
    if (s.kind[i] == DPS_COPY) {
      for (int64_t r = 0; r < p->rows; r++) {
        assert_memory_equal(w + r * p->row_bytes, src + r * p->src_pitch,
                            (size_t)p->row_bytes);
        memcpy(wq + r * l->dst_pitch, src + r * p->src_pitch,
               (size_t)p->row_bytes);
      }
      continue;
    }
    uint8_t *ws = want + ((uint8_t *)l->scale - dst);
    quantize_expected(src, p->src_pitch, p->rows, p->cols, wq, l->dst_pitch, ws,
                      l->scale_pitch);
    for (int64_t r = 0; r < p->rows; r++) {
      if (s.kind[i] ==
          DPS_QUANT_SPLIT) { /* wire row: cols e4m3, then cols/32 scales */
        assert_memory_equal(w + r * p->row_bytes, wq + r * l->dst_pitch,
                            (size_t)p->cols);
        assert_memory_equal(w + r * p->row_bytes + p->cols,
                            ws + r * l->scale_pitch, (size_t)p->cols / 32);
      } else {
        assert_memory_equal(w + r * p->row_bytes, src + r * p->src_pitch,
                            (size_t)p->cols * 2);
      }
    }
  }
  assert_memory_equal(dst, want, (size_t)s.dst_bytes); /* gaps untouched too */
  free(wire);
  free(dst);
  free(want);
  free(pack);
  free(land);
  dps_destroy(&s);
}

static void test_datapath_roundtrip(void **state) {
  (void)state;
  kt_seed("test_datapath_roundtrip");
  for (int iter = 0; iter < 30; iter++)
    roundtrip(kt_rand_range(1, 24), iter % 3);
  roundtrip(300, 2);
}

/* QUANTIZE -> SPLIT of row x column pieces equals quantizing the whole tensor.
 */
static void test_datapath_quantize_pieces(void **state) {
  (void)state;
  kt_seed("test_datapath_quantize_pieces");
  const int64_t R = 96, K = 512, rp = 4, cp = 4; /* 4 x 4 pieces of 24 x 128 */
  uint16_t *t = malloc((size_t)(R * K) * 2);
  for (int64_t i = 0; i < R * K; i++)
    t[i] = kt_rand_bf16();
  uint8_t *q = malloc((size_t)(R * K)), *sc = malloc((size_t)(R * K / 32));
  uint8_t *q2 = calloc((size_t)(R * K), 1),
          *sc2 = calloc((size_t)(R * K / 32), 1);
  assert_int_equal(refit_mxfp8_quantize_rows(t, R, K, K, q, K, sc, K / 32),
                   REFIT_OK);
  refit_pack_desc_t pack[16];
  refit_land_desc_t land[16];
  const int64_t pr = R / rp, pc = K / cp, rb = pc + pc / 32;
  int64_t off = 0;
  for (int64_t a = 0; a < rp; a++)
    for (int64_t b = 0; b < cp; b++) {
      const int64_t i = a * cp + b;
      pack[i] = (refit_pack_desc_t){.src = t + a * pr * K + b * pc,
                                    .src_pitch = K * 2,
                                    .dst_offset = off,
                                    .rows = pr,
                                    .cols = pc,
                                    .row_bytes = rb,
                                    .op = REFIT_CHUNK_QUANTIZE,
                                    .digest = (int32_t)(i & 1)};
      land[i] =
          (refit_land_desc_t){.src_offset = off,
                              .rows = pr,
                              .cols = pc,
                              .row_bytes = rb,
                              .dst = q2 + a * pr * K + b * pc,
                              .dst_pitch = K,
                              .scale = sc2 + a * pr * (K / 32) + b * (pc / 32),
                              .scale_pitch = K / 32,
                              .op = REFIT_CHUNK_SPLIT,
                              .digest = (int32_t)(i & 1)};
      off += pr * rb + (i & 1 ? 8 : 0) + 3; /* odd gaps: misaligned chunks */
    }
  uint8_t *wire = malloc((size_t)off);
  assert_int_equal(refit_pack_rows(pack, 16, dps_tag, wire), REFIT_OK);
  int64_t bad = 0;
  assert_int_equal(refit_land_rows(land, 16, dps_tag, wire, &bad), REFIT_OK);
  assert_int_equal(bad, -1);
  assert_memory_equal(q, q2, (size_t)(R * K));
  assert_memory_equal(sc, sc2, (size_t)(R * K / 32));
  free(t);
  free(q);
  free(sc);
  free(q2);
  free(sc2);
  free(wire);
}

/*
 * BLOCK_QUANTIZE -> BLOCK_SPLIT of rectangles of whole blocks equals block
 * FP8 of the whole tensor, in both scale modes: [300, 384] cut into rows
 * 0..127 (columns 0..127 and 128..383) and rows 128..299 whole (the partial
 * block row, with the tensor's last element, its padding value). Chunks at
 * odd offsets, half of them with digests; every wire row's scale slots
 * carry its block row's scales.
 */
static void test_datapath_block_pieces(void **state) {
  (void)state;
  kt_seed("test_datapath_block_pieces");
  const int64_t R = 300, K = 384, nbr = 3, nbc = 3;
  const int64_t piece[3][4] = {{0, 0, 128, 128}, {0, 128, 128, 256}, {128, 0, 172, 384}};
  uint16_t *t = malloc((size_t)(R * K) * 2);
  for (int64_t i = 0; i < R * K; i++)
    t[i] = kt_rand_bf16();
  for (int mode = 0; mode < 2; mode++) {
    uint8_t *q = malloc((size_t)(R * K)), *q2 = calloc((size_t)(R * K), 1);
    float sc[9], sc2[9] = {0};
    assert_int_equal(refit_fp8_block_quantize(t, R, K, K, (refit_fp8_scale_t)mode, q, K,
                                              sc, nbc),
                     REFIT_OK);
    refit_pack_desc_t pack[3];
    refit_land_desc_t land[3];
    int64_t off = 0;
    for (int i = 0; i < 3; i++) {
      const int64_t r0 = piece[i][0], c0 = piece[i][1], rows = piece[i][2],
                    cols = piece[i][3], rb = cols + 4 * REFIT_BLOCK_WIRE_SLOTS(cols);
      pack[i] = (refit_pack_desc_t){.src = t + r0 * K + c0,
                                    .src_pitch = K * 2,
                                    .dst_offset = off,
                                    .rows = rows,
                                    .cols = cols,
                                    .row_bytes = rb,
                                    .op = REFIT_CHUNK_BLOCK_QUANTIZE,
                                    .digest = (int32_t)(i & 1),
                                    .fp8_scale = mode};
      land[i] = (refit_land_desc_t){.src_offset = off,
                                    .rows = rows,
                                    .cols = cols,
                                    .row_bytes = rb,
                                    .dst = q2 + r0 * K + c0,
                                    .dst_pitch = K,
                                    .scale = (uint8_t *)sc2 +
                                             ((r0 / 128) * nbc + c0 / 128) * 4,
                                    .scale_pitch = nbc * 4,
                                    .op = REFIT_CHUNK_BLOCK_SPLIT,
                                    .digest = (int32_t)(i & 1)};
      off += rows * rb + (i & 1 ? 8 : 0) + 3;
    }
    uint8_t *wire = malloc((size_t)off);
    memset(wire, 0xa5, (size_t)off);
    assert_int_equal(refit_pack_rows(pack, 3, dps_tag, wire), REFIT_OK);
    /* Every row of the last chunk carries its block row's scales (rows 0,
     * 1 and 127 block row 1's, rows 128 and 171 block row 2's). */
    const uint8_t *last = wire + pack[2].dst_offset;
    static const int64_t rows_at[5] = {0, 1, 127, 128, 171};
    for (int j = 0; j < 5; j++)
      assert_memory_equal(last + rows_at[j] * pack[2].row_bytes + K,
                          &sc[(1 + rows_at[j] / 128) * nbc], 12);
    int64_t bad = 0;
    assert_int_equal(refit_land_rows(land, 3, dps_tag, wire, &bad), REFIT_OK);
    assert_int_equal(bad, -1);
    assert_memory_equal(q, q2, (size_t)(R * K));
    assert_memory_equal(sc, sc2, (size_t)(nbr * nbc) * 4);
    free(q);
    free(q2);
    free(wire);
  }
  free(t);
}

/*
 * A flipped bit and a truncated chunk are caught, and land is still one pass:
 * the bad chunk lands what its wire bytes say (the same bytes as a land with
 * its digest off), every other chunk lands as before.
 */
static void test_datapath_digest_detects(void **state) {
  (void)state;
  kt_seed("test_datapath_digest_detects");
  for (int iter = 0; iter < 20; iter++) {
    dps_t s;
    const int64_t n = kt_rand_range(2, 12);
    dps_create(&s, n, 1);
    uint8_t *wire = malloc((size_t)s.wire_bytes),
            *dst = malloc((size_t)s.dst_bytes);
    uint8_t *ref = malloc((size_t)s.dst_bytes);
    refit_pack_desc_t *pack = malloc((size_t)n * sizeof(*pack));
    refit_land_desc_t *land = malloc((size_t)n * sizeof(*land));
    dps_bind(&s, s.src, ref, pack, land);
    assert_int_equal(refit_pack_rows(pack, n, dps_tag, wire), REFIT_OK);
    memset(ref, 0x77, (size_t)s.dst_bytes);
    int64_t bad = 0;
    assert_int_equal(refit_land_rows(land, n, dps_tag, wire, &bad), REFIT_OK);
    assert_int_equal(bad, -1);
    /* Pick a victim chunk with data; corrupt it by a bit flip or truncation. */
    int64_t v = kt_rand_range(0, n - 1);
    while (pack[v].rows * pack[v].row_bytes == 0)
      v = (v + 1) % n;
    const int truncate = iter % 2 == 1 && land[v].rows > 1;
    if (!truncate) {
      const int64_t len = pack[v].rows * pack[v].row_bytes;
      wire[pack[v].dst_offset + kt_rand_range(0, len - 1)] ^=
          (uint8_t)(1u << kt_rand_range(0, 7));
    }
    refit_pack_desc_t *p2 = malloc((size_t)n * sizeof(*p2));
    dps_bind(&s, s.src, dst, p2, land);
    if (truncate)
      land[v].rows--; /* the receiver believes the chunk is a row shorter */
    memset(dst, 0x77, (size_t)s.dst_bytes);
    assert_int_equal(refit_land_rows(land, n, dps_tag, wire, &bad), REFIT_OK);
    assert_int_equal(bad, v);
    /* The same table without digests lands the same bytes, the victim's too. */
    uint8_t *plain = malloc((size_t)s.dst_bytes);
    memset(plain, 0x77, (size_t)s.dst_bytes);
    for (int64_t i = 0; i < n; i++) {
      land[i].digest = 0;
      land[i].dst = plain + ((uint8_t *)land[i].dst - dst);
      land[i].scale = land[i].scale == NULL
                          ? NULL
                          : plain + ((uint8_t *)land[i].scale - dst);
    }
    assert_int_equal(refit_land_rows(land, n, dps_tag, wire, &bad), REFIT_OK);
    assert_int_equal(bad, -1);
    assert_memory_equal(dst, plain, (size_t)s.dst_bytes);
    dps_bind(&s, s.src, dst, p2, land);
    if (truncate)
      land[v].rows--;
    /* Every other chunk landed as before; the victim landed (it differs from
     * the fill) and, for a flipped bit that is moved as it is (a flip in BF16
     * may quantize to the same byte), differs from the intact landing. */
    for (int64_t i = 0; i < n; i++)
      if (i != v)
        assert_true(dps_chunk_same(&s, land, i, dst, dst, ref));
    int landed = 0;
    memset(plain, 0x77, (size_t)s.dst_bytes);
    for (int64_t r = 0; r < land[v].rows; r++) {
      const int64_t width =
          s.kind[v] == DPS_COPY ? land[v].row_bytes : land[v].cols;
      const uint8_t *got = (uint8_t *)land[v].dst + r * land[v].dst_pitch;
      landed |= memcmp(got, plain, (size_t)width) != 0;
    }
    assert_true(landed || land[v].rows == 0);
    if (!truncate && s.kind[v] != DPS_COPY_QUANT)
      assert_false(dps_chunk_same(&s, land, v, dst, dst, ref));
    free(plain);
    free(wire);
    free(dst);
    free(ref);
    free(pack);
    free(land);
    free(p2);
    dps_destroy(&s);
  }
}

/*
 * The seal (core/digest.h): every trailer is the digest of its chunk's rows
 * plus key + tag * REFIT_SEAL_MUL, written out here from that definition. A
 * chunk packed for one refit fails the check of another (its rows intact),
 * and the tag it was packed with comes back from its trailer.
 */
static void test_datapath_seal(void **state) {
  (void)state;
  kt_seed("test_datapath_seal");
  for (int iter = 0; iter < 10; iter++) {
    dps_t s;
    const int64_t n = kt_rand_range(1, 10);
    dps_create(&s, n, 1);
    uint8_t *wire = malloc((size_t)s.wire_bytes), *dst = malloc((size_t)s.dst_bytes);
    refit_pack_desc_t *pack = malloc((size_t)n * sizeof(*pack));
    refit_land_desc_t *land = malloc((size_t)n * sizeof(*land));
    dps_bind(&s, s.src, dst, pack, land);
    const uint64_t sent = dps_tag, other = sent ^ (1ull << kt_rand_range(0, 63));
    assert_int_equal(refit_pack_rows(pack, n, sent, wire), REFIT_OK);
    for (int64_t i = 0; i < n; i++) {
      const uint8_t *w = wire + pack[i].dst_offset;
      const size_t len = (size_t)(pack[i].rows * pack[i].row_bytes);
      uint64_t trailer = 0;
      for (int b = 7; b >= 0; b--)
        trailer = trailer << 8 | w[len + (size_t)b];
      const uint64_t digest = refit_digest64(w, len);
      assert_true(trailer == digest + pack[i].seal_key + sent * 0xD6E8FEB86659FD93ull);
      assert_true(refit_seal_untag(trailer, digest, land[i].seal_key) == sent);
    }
    int64_t bad = 42;
    assert_int_equal(refit_land_rows(land, n, sent, wire, &bad), REFIT_OK);
    assert_int_equal(bad, -1);
    assert_int_equal(refit_land_rows(land, n, other, wire, &bad), REFIT_OK);
    assert_int_equal(bad, 0);
    /* Another chunk's key (a chunk that went to the wrong place) fails too. */
    if (n > 1) {
      land[n - 1].seal_key ^= 1;
      assert_int_equal(refit_land_rows(land, n, sent, wire, &bad), REFIT_OK);
      assert_int_equal(bad, n - 1);
    }
    dps_destroy(&s);
    free(wire);
    free(dst);
    free(pack);
    free(land);
  }
}

static void test_datapath_checks(void **state) {
  (void)state;
  uint8_t src[4096], wire[8192], dst[4096];
  refit_pack_desc_t p[4];
  for (int i = 0; i < 4; i++)
    p[i] = (refit_pack_desc_t){.src = src,
                               .src_pitch = 128,
                               .dst_offset = 1100 * i,
                               .rows = 2,
                               .cols = 64,
                               .row_bytes = 66,
                               .op = REFIT_CHUNK_QUANTIZE};
  assert_int_equal(refit_pack_rows(p, 4, dps_tag, wire), REFIT_OK);
  p[3].cols = 48;
  p[3].row_bytes = 49;
  assert_int_equal(refit_pack_rows(p, 4, dps_tag, wire), REFIT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(refit_last_error(), "descriptor 3"));
  assert_non_null(strstr(refit_last_error(), "multiple of the 32"));
  p[3].cols = 64;
  p[3].row_bytes = 64; /* forgot the scales */
  assert_int_equal(refit_pack_rows(p, 4, dps_tag, wire), REFIT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(refit_last_error(),
                         "descriptor 3: QUANTIZE row_bytes 64, expected 66"));
  p[3].row_bytes = 66;
  p[2].op = REFIT_CHUNK_SPLIT;
  assert_int_equal(refit_pack_descs_check(p, 4), REFIT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(refit_last_error(), "descriptor 2"));

  refit_land_desc_t l = {.src_offset = 0,
                         .rows = 2,
                         .cols = 64,
                         .row_bytes = 66,
                         .dst = dst,
                         .dst_pitch = 64,
                         .scale = dst + 2048,
                         .scale_pitch = 2,
                         .op = REFIT_CHUNK_QUANTIZE};
  int64_t bad = 7;
  assert_int_equal(refit_land_rows(&l, 1, dps_tag, wire, &bad),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(refit_last_error(),
                         "descriptor 0: QUANTIZE row_bytes 66, expected 128"));
  assert_int_equal(bad, 7); /* outputs untouched on error */
  l.op = REFIT_CHUNK_SPLIT;
  l.scale_pitch = 1;
  assert_int_equal(refit_land_rows(&l, 1, dps_tag, wire, &bad),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(refit_last_error(), "scale_pitch"));
  l.scale_pitch = 2;
  assert_int_equal(refit_land_rows(&l, 1, dps_tag, wire, &bad), REFIT_OK);
  assert_int_equal(bad, -1);

  /* Block FP8: any cols, row_bytes with one 4-byte slot per 128 columns, a
   * scale mode, a scale row pitch once there are two block rows; BLOCK_SPLIT
   * is not a pack op and BLOCK_QUANTIZE not a land op. */
  refit_pack_desc_t b = {.src = src,
                         .src_pitch = 200,
                         .rows = 2,
                         .cols = 100,
                         .row_bytes = 104,
                         .op = REFIT_CHUNK_BLOCK_QUANTIZE};
  assert_int_equal(refit_pack_descs_check(&b, 1), REFIT_OK);
  b.row_bytes = 100;
  assert_int_equal(refit_pack_descs_check(&b, 1), REFIT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(refit_last_error(),
                         "descriptor 0: BLOCK_QUANTIZE row_bytes 100, expected 104"));
  b.row_bytes = 104;
  b.fp8_scale = 2;
  assert_int_equal(refit_pack_descs_check(&b, 1), REFIT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(refit_last_error(), "fp8_scale 2"));
  b.fp8_scale = 1;
  b.op = REFIT_CHUNK_BLOCK_SPLIT;
  assert_int_equal(refit_pack_descs_check(&b, 1), REFIT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(refit_last_error(), "op 4 is not"));
  refit_land_desc_t lb = {.rows = 129,
                          .cols = 100,
                          .row_bytes = 104,
                          .dst = dst,
                          .dst_pitch = 100,
                          .scale = dst,
                          .scale_pitch = 3,
                          .op = REFIT_CHUNK_BLOCK_SPLIT};
  assert_int_equal(refit_land_descs_check(&lb, 1), REFIT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(refit_last_error(), "scale_pitch 3"));
  lb.scale_pitch = 4;
  assert_int_equal(refit_land_descs_check(&lb, 1), REFIT_OK);
  lb.op = REFIT_CHUNK_BLOCK_QUANTIZE;
  assert_int_equal(refit_land_descs_check(&lb, 1), REFIT_ERR_INVALID_ARGUMENT);
}

/* A random key: both modes, norms and not. */
static refit_synth_key_t random_synth_key(int norm, int update) {
  refit_synth_key_t k = {.key = kt_rand(), .master = kt_rand(), .norm = norm};
  k.rate = update ? (float)kt_rand_range(1, 100000) * 1e-7f : 0.0f;
  return k;
}

static void test_datapath_synth(void **state) {
  (void)state;
  kt_seed("test_datapath_synth");
  const int64_t R = 37, C = 203;
  for (int mode = 0; mode < 4; mode++) {
    const refit_synth_key_t key = random_synth_key(mode & 1, mode >> 1);
    uint16_t *whole = malloc((size_t)(R * C) * 2);
    refit_synth_rect(&key, C, 0, 0, R, C, whole);
    for (int64_t r = 0; r < R; r++)
      for (int64_t c = 0; c < C; c++)
        assert_int_equal(whole[r * C + c], refit_synth_value(&key, r * C + c));
    /* A sub-rectangle is the same part of the whole tensor. */
    const int64_t r0 = 5, c0 = 17, rows = 20, cols = 101;
    uint16_t *part = malloc((size_t)(rows * cols) * 2);
    refit_synth_rect(&key, C, r0, c0, rows, cols, part);
    for (int64_t r = 0; r < rows; r++)
      assert_memory_equal(part + r * cols, whole + (r0 + r) * C + c0,
                          (size_t)cols * 2);
    free(whole);
    free(part);
  }
  refit_synth_key_t keys[12];
  int64_t bases[12];
  for (int r = 0; r < 12; r++) {
    keys[r] = random_synth_key(r % 3 == 0, r % 2);
    bases[r] = kt_rand_range(0, 1 << 30);
  }
  uint16_t out[12 * 77];
  refit_synth_rows(keys, bases, 12, 77, out);
  for (int r = 0; r < 12; r++)
    for (int c = 0; c < 77; c++)
      assert_int_equal(out[r * 77 + c], refit_synth_value(&keys[r], bases[r] + c));
  /* Values look like weights: norms in [1, 2), moved by an update by up to
   * its rate and BF16's rounding (at most 2^-8 of the value), others small
   * and finite. */
  for (int r = 0; r < 12; r++)
    for (int c = 0; c < 77; c++) {
      const float v = refit_bf16_to_float(out[r * 77 + c]);
      const double rate = keys[r].rate;
      if (keys[r].norm)
        assert_true(v >= (1.0 - rate) * (1.0 - 1.0 / 256) &&
                    v <= 2.0 * (1.0 + rate) * (1.0 + 1.0 / 256));
      else
        assert_true(v != 0.0f && v > -0.5f && v < 0.5f);
    }
}

static void test_datapath_compare(void **state) {
  (void)state;
  kt_seed("test_datapath_compare");
  uint8_t a[1001], b[1001];
  kt_fill_bytes(a, sizeof(a));
  memcpy(b, a, sizeof(a));
  int64_t count = -1, first = -1;
  assert_int_equal(refit_compare(a, b, 1000, 2, &count, &first), REFIT_OK);
  assert_int_equal(count, 0);
  assert_true(first == INT64_MAX);
  b[332] ^= 1;
  b[333] ^= 4; /* same 2-byte element */
  b[900] ^= 0x80;
  assert_int_equal(refit_compare(a, b, 1000, 2, &count, &first), REFIT_OK);
  assert_int_equal(count, 2);
  assert_int_equal(first, 166);
  assert_int_equal(refit_compare(a, b, 1001, 1, &count, &first), REFIT_OK);
  assert_int_equal(count, 3);
  assert_int_equal(first, 332);
  assert_int_equal(refit_compare(a, b, 1001, 2, &count, &first),
                   REFIT_ERR_INVALID_ARGUMENT);
  /* 4-byte elements (FP32 scales): 332 and 333 are one element. */
  assert_int_equal(refit_compare(a, b, 1000, 4, &count, &first), REFIT_OK);
  assert_int_equal(count, 2);
  assert_int_equal(first, 83);
  assert_int_equal(refit_compare(a, b, 1000, 3, &count, &first),
                   REFIT_ERR_INVALID_ARGUMENT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_datapath_roundtrip),
      cmocka_unit_test(test_datapath_quantize_pieces),
      cmocka_unit_test(test_datapath_block_pieces),
      cmocka_unit_test(test_datapath_digest_detects),
      cmocka_unit_test(test_datapath_seal),
      cmocka_unit_test(test_datapath_checks),
      cmocka_unit_test(test_datapath_synth),
      cmocka_unit_test(test_datapath_compare),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

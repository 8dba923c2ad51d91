/*
 * MXFP8 quantization against an independent exact reference.
 *
 * The reference works on exact values in long double (64-bit significand,
 * 15-bit exponent: every BF16 value times every power of two used here, every
 * E4M3 value and every midpoint between two of them is exact), rounds by
 * comparing with both neighbours from a table of all E4M3 values, and derives
 * the scale from the formula clamp(ceil(log2(amax/448)) + 127, 0, 254) with
 * exact comparisons instead of the GPU bit recipe the code under test uses.
 */
#include "kernels/mxfp8.h"
#include "kernels_test.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

/* ---- Exact reference --------------------------------------------------- */

static long double ref_mag[127]; /* value of E4M3 code i, i = 0..0x7E */

static void ref_init(void) {
  for (int i = 0; i < 127; i++) {
    int e = i >> 3, m = i & 7;
    ref_mag[i] = e == 0 ? ldexpl((long double)m, -9)
                        : ldexpl((long double)(8 + m), e - 10);
  }
}

static uint8_t ref_e4m3(long double v) {
  if (isnan(v))
    return 0x7F;
  uint8_t sign = signbit(v) ? 0x80 : 0;
  long double a = fabsl(v);
  if (a >= ref_mag[126])
    return sign | 0x7E;
  int lo = 0, hi = 126; /* ref_mag[lo] <= a < ref_mag[hi] */
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (ref_mag[mid] <= a)
      lo = mid;
    else
      hi = mid;
  }
  long double twice = 2 * a, mid = ref_mag[lo] + ref_mag[hi];
  int code = twice < mid ? lo : twice > mid ? hi : (lo % 2 == 0 ? lo : hi);
  return (uint8_t)(sign | code);
}

/* clamp(ceil(log2(amax/448)) + 127, 0, 254), exactly; 0 for amax == 0. */
static int ref_scale(long double amax) {
  if (amax == 0)
    return 0;
  if (isinf(amax))
    return 254;
  int n = ilogbl(amax) - 8; /* close guess, then exact adjustment */
  while (ldexpl(448.0L, n) < amax)
    n++;
  while (ldexpl(448.0L, n - 1) >= amax)
    n--;
  int E = n + 127;
  return E < 0 ? 0 : E > 254 ? 254 : E;
}

static long double bf16_exact(uint16_t b) {
  return (long double)refit_bf16_to_float(b);
}

/* ---- Every code quantize_rows runs -------------------------------------- */

/* The codes to check: the portable one always, AVX-512 where the CPU runs it
 * (said once, so a log shows which were checked). */
static int codes_n;
static refit_mxfp8_code_t codes[2];

static void codes_init(void) {
  codes[codes_n++] = REFIT_MXFP8_CODE_PORTABLE;
  if (refit_mxfp8_quantize_use(REFIT_MXFP8_CODE_AVX512) == REFIT_OK)
    codes[codes_n++] = REFIT_MXFP8_CODE_AVX512;
  else
    printf("this CPU has no AVX-512 (F, BW, VL): the portable code only\n");
  assert_int_equal(refit_mxfp8_quantize_use(REFIT_MXFP8_CODE_BEST), REFIT_OK);
}

static void use_code(refit_mxfp8_code_t code) {
  assert_int_equal(refit_mxfp8_quantize_use(code), REFIT_OK);
  assert_int_equal(refit_mxfp8_quantize_code(), code);
}

/* One block through refit_mxfp8_quantize_block and through quantize_rows
 * under every code: all must write the same bytes; returns the scale. */
static uint8_t qblock(const uint16_t *blk, uint8_t *q) {
  uint8_t sc = refit_mxfp8_quantize_block(blk, q);
  for (int c = 0; c < codes_n; c++) {
    uint8_t qc[32], scc = 0;
    use_code(codes[c]);
    assert_int_equal(refit_mxfp8_quantize_rows(blk, 1, 32, 32, qc, 32, &scc, 1), REFIT_OK);
    if (scc != sc || memcmp(qc, q, 32) != 0)
      printf("code %s differs from refit_mxfp8_quantize_block\n",
             refit_mxfp8_code_name(codes[c]));
    assert_int_equal(scc, sc);
    assert_memory_equal(qc, q, 32);
  }
  assert_int_equal(refit_mxfp8_quantize_use(REFIT_MXFP8_CODE_BEST), REFIT_OK);
  return sc;
}

/* ---- Scale rule -------------------------------------------------------- */

static void test_scale_rule_every_bf16_amax(void **state) {
  (void)state;
  for (uint32_t b = 1; b < 0x7f80; b++) {
    int want = ref_scale(bf16_exact((uint16_t)b));
    int got = refit_mxfp8_scale_exponent(refit_bf16_to_float((uint16_t)b));
    if (got != want)
      printf("amax bf16 0x%04x (%Lg)\n", b, bf16_exact((uint16_t)b));
    assert_int_equal(got, want);
  }
  assert_int_equal(refit_mxfp8_scale_exponent(0.0f), 0);
  assert_int_equal(refit_mxfp8_scale_exponent(INFINITY), 254);
  assert_int_equal(refit_mxfp8_scale_exponent(NAN), 0);
  /* Edges: 448 is exactly 2^0 * 448, 449 needs the next power. */
  assert_int_equal(refit_mxfp8_scale_exponent(448.0f), 127);
  assert_int_equal(refit_mxfp8_scale_exponent(449.0f), 128);
  assert_int_equal(refit_mxfp8_scale_exponent(224.0f), 126);
  assert_int_equal(refit_mxfp8_scale_exponent(1.0f), 119);
}

/* ---- E4M3 encoding ----------------------------------------------------- */

static void test_e4m3_edges(void **state) {
  (void)state;
  struct {
    float v;
    uint8_t q;
  } cases[] = {
      {0.0f, 0x00},          {-0.0f, 0x80},         {448.0f, 0x7E},
      {-448.0f, 0xFE},       {464.0f, 0x7E},        {465.0f, 0x7E},
      {1e30f, 0x7E},         {INFINITY, 0x7E},      {-INFINITY, 0xFE},
      {NAN, 0x7F},           {-NAN, 0x7F},          {0x1p-10f, 0x00},
      {0x1.8p-9f, 0x02},     {0x1p-9f, 0x01},       {0x1.4p-9f, 0x01},
      {0x1p-6f, 0x08},       {0x1.fp-7f, 0x08},     {0x1.1p0f, 0x38},
      {0x1.3p0f, 0x3A},      {240.0f, 0x77},        {416.0f, 0x7D},
      {-0x1p-11f, 0x80},     {0x1.000002p-10f, 0x01},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    uint8_t got = refit_mxfp8_e4m3_encode(cases[i].v);
    if (got != cases[i].q)
      printf("case %zu: v = %a\n", i, (double)cases[i].v);
    assert_int_equal(got, cases[i].q);
    assert_int_equal(got, ref_e4m3((long double)cases[i].v));
  }
  /* decode is the exact inverse on every finite code */
  for (int c = 0; c < 256; c++) {
    if ((c & 0x7f) == 0x7f) {
      assert_true(isnan(refit_mxfp8_e4m3_decode((uint8_t)c)));
      continue;
    }
    long double want = (c & 0x80) ? -ref_mag[c & 0x7f] : ref_mag[c & 0x7f];
    assert_true((long double)refit_mxfp8_e4m3_decode((uint8_t)c) == want);
    assert_int_equal(refit_mxfp8_e4m3_encode(refit_mxfp8_e4m3_decode((uint8_t)c)),
                     c);
  }
}

/* Random fp32 bit patterns, half of them in the range where rounding matters. */
static void test_e4m3_random_floats(void **state) {
  (void)state;
  kt_seed("test_e4m3_random_floats");
  for (int i = 0; i < 2000000; i++) {
    uint32_t u = (uint32_t)kt_rand();
    if (i & 1)
      u = (u & 0x807fffffu) | ((uint32_t)kt_rand_range(127 - 14, 127 + 10) << 23);
    float f;
    memcpy(&f, &u, sizeof(f));
    uint8_t got = refit_mxfp8_e4m3_encode(f), want = ref_e4m3((long double)f);
    if (got != want)
      printf("fp32 0x%08x\n", u);
    assert_int_equal(got, want);
  }
}

/*
 * Every BF16 x with every scale E the quantizer can produce: for each E, a
 * block is led by the largest amax that yields E (Inf for E = 254; finite BF16
 * cannot reach 248..253) and filled with every BF16 of magnitude <= amax, both
 * signs, so each element's expected byte is ref_e4m3(x * 2^(127-E)).
 */
static void test_quantize_every_bf16_every_scale(void **state) {
  (void)state;
  static int scale_of[0x7f81];
  for (uint32_t b = 0; b <= 0x7f80; b++)
    scale_of[b] = ref_scale(b == 0x7f80 ? INFINITY : bf16_exact((uint16_t)b));
  int64_t checked = 0;
  for (int E = 1; E <= 254; E++) {
    int32_t amax = -1;
    for (uint32_t b = 0; b <= 0x7f80; b++)
      if (scale_of[b] == E)
        amax = (int32_t)b;
    if (amax < 0) {
      assert_true(E >= 248 && E <= 253);
      continue;
    }
    uint16_t blk[32];
    uint8_t q[32];
    int n = 1;
    blk[0] = (uint16_t)amax;
    for (int32_t x = 0; x <= 2 * amax + 1; x++) {
      uint16_t v = (uint16_t)((x >> 1) | ((x & 1) << 15));
      blk[n++] = v;
      if (n < 32 && x != 2 * amax + 1)
        continue;
      while (n < 32) /* pad the last block with copies of the leader */
        blk[n++] = (uint16_t)amax;
      uint8_t sc = qblock(blk, q);
      assert_int_equal(sc, E);
      for (int i = 0; i < 32; i++) {
        long double xv = blk[i] == 0x7f80   ? INFINITY
                         : blk[i] == 0xff80 ? -INFINITY
                                            : bf16_exact(blk[i]);
        uint8_t want = ref_e4m3(ldexpl(xv, 127 - E));
        if (q[i] != want)
          printf("E = %d, x = 0x%04x\n", E, blk[i]);
        assert_int_equal(q[i], want);
      }
      checked += 32;
      n = 1;
    }
  }
  printf("checked %lld (x, E) pairs\n", (long long)checked);
}

/* ---- Special blocks ---------------------------------------------------- */

static void fill_block(uint16_t *blk, uint16_t v) {
  for (int i = 0; i < 32; i++)
    blk[i] = v;
}

static void test_special_blocks(void **state) {
  (void)state;
  uint16_t blk[32];
  uint8_t q[32];

  /* All zeros: stored scale 1, elements 0; -0.0 keeps its sign (0x80). */
  fill_block(blk, 0x0000);
  blk[3] = 0x8000;
  assert_int_equal(qblock(blk, q), 1);
  for (int i = 0; i < 32; i++)
    assert_int_equal(q[i], i == 3 ? 0x80 : 0x00);

  /* BF16 subnormal amax: E = 0 -> stored 1, inverse scale 0 -> zeros. */
  fill_block(blk, 0x0001);
  blk[7] = 0x007f;
  assert_int_equal(qblock(blk, q), 1);
  for (int i = 0; i < 32; i++)
    assert_int_equal(q[i], 0);

  /* Smallest amax with E = 1 (amax > 448 * 2^-127 = 0x1.cp-119). */
  fill_block(blk, 0x0400); /* 2^-119 */
  blk[0] = 0x0461;         /* 0x1.c2p-119 */
  assert_int_equal(qblock(blk, q), 1);
  assert_int_equal(q[0], ref_e4m3(ldexpl(bf16_exact(0x0461), 126)));
  assert_int_equal(q[1], ref_e4m3(ldexpl(bf16_exact(0x0400), 126)));

  /* NaN takes no part in amax and encodes as 0x7F whatever its sign. */
  fill_block(blk, 0x3f80); /* 1.0 */
  blk[0] = 0x7fc0;
  blk[1] = 0xffc1;
  blk[2] = 0x4000; /* 2.0 is the amax */
  assert_int_equal(qblock(blk, q), ref_scale(2.0L));
  assert_int_equal(q[0], 0x7F);
  assert_int_equal(q[1], 0x7F);
  assert_int_equal(q[2], ref_e4m3(ldexpl(2.0L, 127 - ref_scale(2.0L))));

  /* Only NaN: E = 0 (stored 1), every element 0x7F. */
  fill_block(blk, 0x7fc0);
  assert_int_equal(qblock(blk, q), 1);
  for (int i = 0; i < 32; i++)
    assert_int_equal(q[i], 0x7F);

  /* Inf: E = 254, +-Inf -> +-448, finite elements scaled by 2^-127. */
  fill_block(blk, 0x3f80);
  blk[0] = 0x7f80;
  blk[1] = 0xff80;
  blk[2] = 0x7f7f; /* largest finite: 0x1.fep127 * 2^-127 = 1.98 -> 2.0 */
  assert_int_equal(qblock(blk, q), 254);
  assert_int_equal(q[0], 0x7E);
  assert_int_equal(q[1], 0xFE);
  assert_int_equal(q[2], 0x40);
  assert_int_equal(q[3], 0x00);

  /* Saturation edges: the block max lands in (224, 448]. */
  fill_block(blk, 0);
  blk[0] = 0x43e0; /* 448 -> E = 127, q = 448 */
  assert_int_equal(qblock(blk, q), 127);
  assert_int_equal(q[0], 0x7E);
  blk[0] = 0x43e1; /* 450 -> E = 128, q = 225 -> 224 */
  assert_int_equal(qblock(blk, q), 128);
  assert_int_equal(q[0], 0x76);
  blk[0] = 0x7f7f; /* largest finite BF16: never saturates */
  assert_int_equal(qblock(blk, q), 247);
  assert_int_equal(q[0], ref_e4m3(ldexpl(bf16_exact(0x7f7f), 127 - 247)));
  assert_true(q[0] < 0x7E);
}

/* ---- Whole matrices ---------------------------------------------------- */

static void test_quantize_rows_errors(void **state) {
  (void)state;
  uint16_t src[64] = {1};
  uint8_t q[64], sc[2];
  assert_int_equal(refit_mxfp8_quantize_rows(src, 1, 48, 48, q, 48, sc, 2),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(refit_last_error(), "K = 48"));
  assert_int_equal(refit_mxfp8_quantize_rows(src, 1, 64, 32, q, 64, sc, 2),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_mxfp8_quantize_rows(NULL, 1, 64, 64, q, 64, sc, 2),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_mxfp8_quantize_rows(src, -1, 64, 64, q, 64, sc, 2),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_mxfp8_quantize_rows(NULL, 0, 64, 64, NULL, 64, NULL, 2),
                   REFIT_OK);
}

/* Strided rows == block by block; no scale byte is 0; padding untouched. */
static void test_quantize_rows_strided(void **state) {
  (void)state;
  kt_seed("test_quantize_rows_strided");
  for (int iter = 0; iter < 20 * codes_n; iter++) {
    use_code(codes[iter % codes_n]);
    int64_t rows = kt_rand_range(1, 40), k = 32 * kt_rand_range(1, 24);
    int64_t ss = k + kt_rand_range(0, 40), qs = k + kt_rand_range(0, 9),
            cs = k / 32 + kt_rand_range(0, 5);
    uint16_t *src = malloc((size_t)(rows * ss) * 2);
    uint8_t *q = malloc((size_t)(rows * qs)), *sc = malloc((size_t)(rows * cs));
    for (int64_t i = 0; i < rows * ss; i++)
      src[i] = kt_rand_bf16();
    memset(q, 0xAB, (size_t)(rows * qs));
    memset(sc, 0xAB, (size_t)(rows * cs));
    assert_int_equal(refit_mxfp8_quantize_rows(src, rows, k, ss, q, qs, sc, cs),
                     REFIT_OK);
    for (int64_t r = 0; r < rows; r++) {
      for (int64_t b = 0; b < k / 32; b++) {
        uint8_t want_q[32];
        uint8_t want_s = refit_mxfp8_quantize_block(src + r * ss + b * 32, want_q);
        assert_int_equal(sc[r * cs + b], want_s);
        assert_int_not_equal(sc[r * cs + b], 0);
        assert_memory_equal(q + r * qs + b * 32, want_q, 32);
      }
      for (int64_t c = k; c < qs; c++)
        assert_int_equal(q[r * qs + c], 0xAB);
      for (int64_t c = k / 32; c < cs; c++)
        assert_int_equal(sc[r * cs + c], 0xAB);
    }
    free(src);
    free(q);
    free(sc);
  }
  assert_int_equal(refit_mxfp8_quantize_use(REFIT_MXFP8_CODE_BEST), REFIT_OK);
}

/*
 * The codes agree on a large matrix of every kind of BF16 (every bit pattern
 * equally likely: NaNs, infinities, subnormals, zeros of both signs among
 * them, and blocks of them), rows of odd lengths, and each agrees with the
 * exact reference on a sample of its blocks. A code the CPU cannot run is
 * refused by name.
 */
static void test_quantize_codes_agree(void **state) {
  (void)state;
  kt_seed("test_quantize_codes_agree");
  const int64_t rows = 333, k = 32 * 37, n = rows * k;
  uint16_t *src = malloc((size_t)n * 2);
  uint8_t *q[2] = {malloc((size_t)n), malloc((size_t)n)};
  uint8_t *sc[2] = {malloc((size_t)n / 32), malloc((size_t)n / 32)};
  for (int64_t i = 0; i < n; i++) /* any pattern in a third of the blocks */
    src[i] = (i / 32) % 3 == 0 ? (uint16_t)kt_rand() : kt_rand_bf16();
  for (int c = 0; c < codes_n; c++) {
    use_code(codes[c]);
    assert_int_equal(refit_mxfp8_quantize_rows(src, rows, k, k, q[c], k, sc[c], k / 32),
                     REFIT_OK);
  }
  assert_int_equal(refit_mxfp8_quantize_use(REFIT_MXFP8_CODE_BEST), REFIT_OK);
  for (int c = 1; c < codes_n; c++) {
    assert_memory_equal(q[c], q[0], (size_t)n);
    assert_memory_equal(sc[c], sc[0], (size_t)n / 32);
  }
  for (int64_t b = 0; b < n / 32; b += 7) {
    long double amax = 0;
    for (int i = 0; i < 32; i++) {
      uint16_t x = src[b * 32 + i];
      long double v = (x & 0x7fff) == 0x7f80 ? INFINITY : fabsl(bf16_exact(x));
      if ((x & 0x7fff) <= 0x7f80 && v > amax)
        amax = v;
    }
    int E = ref_scale(amax);
    assert_int_equal(sc[codes_n - 1][b], E == 0 ? 1 : E);
    for (int i = 0; i < 32; i++) {
      uint16_t x = src[b * 32 + i];
      long double v = (x & 0x7fff) > 0x7f80    ? NAN
                      : (x & 0x7fff) == 0x7f80 ? ((x & 0x8000) ? -INFINITY : INFINITY)
                                               : bf16_exact(x);
      /* E = 0 multiplies by 0: every element is a signed zero (or NaN). */
      uint8_t want = E == 0 ? (isnan(v) ? 0x7F : (x & 0x8000) ? 0x80 : 0)
                            : ref_e4m3(ldexpl(v, 127 - E));
      assert_int_equal(q[codes_n - 1][b * 32 + i], want);
    }
  }
  assert_int_equal(refit_mxfp8_quantize_use((refit_mxfp8_code_t)7), REFIT_ERR_NOT_AVAILABLE);
  assert_non_null(strstr(refit_last_error(), "cannot run"));
  free(src);
  for (int c = 0; c < 2; c++) {
    free(q[c]);
    free(sc[c]);
  }
}

/*
 * Threads and slicing do not change bytes: a large matrix quantized with 1
 * and with 4 threads, and as two row slices (a fused tensor's pieces), agrees.
 */
static void test_quantize_rows_threads_and_slices(void **state) {
  (void)state;
  kt_seed("test_quantize_rows_threads_and_slices");
  int64_t rows = 768, k = 2048, n = rows * k;
  uint16_t *src = malloc((size_t)n * 2);
  uint8_t *q1 = malloc((size_t)n), *q4 = malloc((size_t)n),
          *qs = malloc((size_t)n);
  uint8_t *s1 = malloc((size_t)n / 32), *s4 = malloc((size_t)n / 32),
          *ss = malloc((size_t)n / 32);
  for (int64_t i = 0; i < n; i++)
    src[i] = kt_rand_bf16();
  /* The last code checked is the one the rest of the test runs. */
  use_code(codes[codes_n - 1]);
  refit_kernels_threads_set(1);
  assert_int_equal(refit_mxfp8_quantize_rows(src, rows, k, k, q1, k, s1, k / 32),
                   REFIT_OK);
  refit_kernels_threads_set(4);
  assert_int_equal(refit_mxfp8_quantize_rows(src, rows, k, k, q4, k, s4, k / 32),
                   REFIT_OK);
  int64_t cut = kt_rand_range(1, rows - 1);
  assert_int_equal(refit_mxfp8_quantize_rows(src, cut, k, k, qs, k, ss, k / 32),
                   REFIT_OK);
  assert_int_equal(refit_mxfp8_quantize_rows(src + cut * k, rows - cut, k, k,
                                             qs + cut * k, k, ss + cut * k / 32,
                                             k / 32),
                   REFIT_OK);
  refit_kernels_threads_set(0);
  assert_int_equal(refit_mxfp8_quantize_use(REFIT_MXFP8_CODE_BEST), REFIT_OK);
  assert_memory_equal(q1, q4, (size_t)n);
  assert_memory_equal(s1, s4, (size_t)n / 32);
  assert_memory_equal(q1, qs, (size_t)n);
  assert_memory_equal(s1, ss, (size_t)n / 32);
  /* Round trip: |x - x_hat| is at most half an E4M3 step of the block. */
  for (int64_t i = 0; i < n; i += 97) {
    float x = refit_bf16_to_float(src[i]);
    int E = s1[i / 32];
    long double xh = ldexpl(refit_mxfp8_e4m3_decode(q1[i]), E - 127);
    long double tol = ldexpl(fabsl((long double)x), -4) + ldexpl(1.0L, E - 127 - 10);
    assert_true(fabsl(xh - (long double)x) <= tol);
  }
  free(src);
  free(q1);
  free(q4);
  free(qs);
  free(s1);
  free(s4);
  free(ss);
}

int main(void) {
  ref_init();
  codes_init();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_scale_rule_every_bf16_amax),
      cmocka_unit_test(test_e4m3_edges),
      cmocka_unit_test(test_e4m3_random_floats),
      cmocka_unit_test(test_quantize_every_bf16_every_scale),
      cmocka_unit_test(test_special_blocks),
      cmocka_unit_test(test_quantize_rows_errors),
      cmocka_unit_test(test_quantize_rows_strided),
      cmocka_unit_test(test_quantize_codes_agree),
      cmocka_unit_test(test_quantize_rows_threads_and_slices),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

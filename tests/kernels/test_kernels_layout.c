/*
 * Layout transforms: worked values of the contract, permutation properties,
 * batched MoE == the per-expert oracle, dense backends == a step-by-step
 * oracle written here (pad, shuffle by dst32 scatter, swizzle by offset
 * scatter), and the shape rules with their messages.
 */
#include "kernels/layout.h"
#include "kernels/mxfp8.h"
#include "kernels_test.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

/* Oracle: scatter a linear [rows, cols] matrix into a zeroed swizzle. */
static void oracle_swizzle(const uint8_t *lin, int64_t rows, int64_t cols,
                           uint8_t *out) {
  int64_t kp = refit_round_up(cols, 4);
  memset(out, 0, (size_t)refit_kernels_swizzle_bytes(rows, cols));
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++)
      out[refit_kernels_swizzle_offset(r, c, kp)] = lin[r * cols + c];
}

static void test_swizzle_worked_offsets(void **state) {
  (void)state;
  struct {
    int64_t r, c, off;
  } w[] = {{0, 0, 0},    {1, 0, 16},    {31, 0, 496},   {32, 0, 4},
           {64, 0, 8},   {96, 0, 12},   {0, 1, 1},      {0, 3, 3},
           {0, 4, 512},  {127, 0, 508}, {128, 0, 1024}, {255, 7, 2047}};
  for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++)
    assert_int_equal(refit_kernels_swizzle_offset(w[i].r, w[i].c, 8), w[i].off);
  assert_int_equal(refit_kernels_swizzle_bytes(256, 8), 2048);
  assert_int_equal(refit_kernels_swizzle_bytes(1, 1), 512);
  assert_int_equal(refit_kernels_swizzle_bytes(129, 5), 256 * 8);

  /* The same worked values through the swizzle itself. */
  uint8_t lin[256 * 8], out[2048];
  for (int i = 0; i < 256 * 8; i++)
    lin[i] = (uint8_t)(i * 37 + 11);
  assert_int_equal(refit_kernels_scale_swizzle(lin, 1, 256, 8, out), REFIT_OK);
  for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++)
    assert_int_equal(out[w[i].off], lin[w[i].r * 8 + w[i].c]);
}

/* Stacks of random matrices, rows and columns needing padding. */
static void test_swizzle_random_stacks(void **state) {
  (void)state;
  kt_seed("test_swizzle_random_stacks");
  for (int iter = 0; iter < 40; iter++) {
    int64_t num = kt_rand_range(1, 4), rows = kt_rand_range(1, 300),
            cols = kt_rand_range(1, 23);
    int64_t sb = refit_kernels_swizzle_bytes(rows, cols);
    uint8_t *lin = malloc((size_t)(num * rows * cols));
    uint8_t *got = malloc((size_t)(num * sb)), *want = malloc((size_t)(num * sb));
    kt_fill_bytes(lin, (size_t)(num * rows * cols));
    memset(got, 0xCD, (size_t)(num * sb));
    for (int64_t e = 0; e < num; e++)
      oracle_swizzle(lin + e * rows * cols, rows, cols, want + e * sb);
    assert_int_equal(refit_kernels_scale_swizzle(lin, num, rows, cols, got),
                     REFIT_OK);
    assert_memory_equal(got, want, (size_t)(num * sb));
    free(lin);
    free(got);
    free(want);
  }
  assert_int_equal(refit_kernels_scale_swizzle(NULL, 1, 1, 1, NULL),
                   REFIT_ERR_INVALID_ARGUMENT);
}

static void test_permutations(void **state) {
  (void)state;
  const int64_t sizes[] = {64, 128, 256, 384, 1536, 4096};
  for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
    int64_t n = sizes[s];
    for (int kind = 0; kind <= REFIT_KERNELS_PERM_SRC13; kind++) {
      const int32_t *p, *p2;
      assert_int_equal(refit_kernels_perm_get(kind, n, &p), REFIT_OK);
      assert_int_equal(refit_kernels_perm_get(kind, n, &p2), REFIT_OK);
      assert_ptr_equal(p, p2); /* cached */
      uint8_t *seen = calloc((size_t)n, 1);
      for (int64_t j = 0; j < n; j++) {
        assert_true(p[j] >= 0 && p[j] < n);
        assert_int_equal(seen[p[j]], 0); /* bijection */
        seen[p[j]] = 1;
      }
      free(seen);
      int64_t *p64 = malloc((size_t)n * sizeof(int64_t));
      assert_int_equal(refit_kernels_perm_fill_i64(kind, n, p64), REFIT_OK);
      for (int64_t j = 0; j < n; j++)
        assert_int_equal(p64[j], p[j]);
      free(p64);
    }
    const int32_t *src, *dst;
    assert_int_equal(refit_kernels_perm_get(REFIT_KERNELS_PERM_SRC32, n, &src),
                     REFIT_OK);
    assert_int_equal(refit_kernels_perm_get(REFIT_KERNELS_PERM_DST32, n, &dst),
                     REFIT_OK);
    for (int64_t j = 0; j < n; j++) {
      assert_int_equal(dst[src[j]], j);
      assert_int_equal(src[dst[j]], j);
    }
  }
  /* src13 worked rows, I = 128 (256 rows). */
  const int32_t *p;
  assert_int_equal(refit_kernels_perm_get(REFIT_KERNELS_PERM_SRC13, 256, &p),
                   REFIT_OK);
  for (int i = 0; i < 8; i++) {
    assert_int_equal(p[i], 128 + 2 * i);
    assert_int_equal(p[8 + i], 2 * i);
    assert_int_equal(p[16 + i], 129 + 2 * i);
    assert_int_equal(p[24 + i], 1 + 2 * i);
  }
  assert_int_equal(p[255], 127);
  /* shape rule */
  assert_int_equal(refit_kernels_perm_get(REFIT_KERNELS_PERM_SRC32, 48, &p),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(refit_last_error(), "multiple of 32"));
  assert_int_equal(refit_kernels_perm_get(REFIT_KERNELS_PERM_SRC13, 96, &p),
                   REFIT_ERR_INVALID_ARGUMENT);
}

static void *perm_thread(void *arg) {
  const int32_t **out = arg;
  for (int i = 0; i < 64; i++) {
    int64_t rows = 32 * (1 + (i % 16)) + 4096;
    if (refit_kernels_perm_get(REFIT_KERNELS_PERM_SRC32, rows, &out[i]) !=
        REFIT_OK)
      out[i] = NULL;
  }
  return NULL;
}

/* Concurrent first uses of the cache agree on one array per shape. */
static void test_perm_cache_threads(void **state) {
  (void)state;
  refit_kernels_perm_cache_clear();
  pthread_t t[4];
  const int32_t *out[4][64];
  for (int i = 0; i < 4; i++)
    assert_int_equal(pthread_create(&t[i], NULL, perm_thread, out[i]), 0);
  for (int i = 0; i < 4; i++)
    pthread_join(t[i], NULL);
  for (int i = 0; i < 64; i++) {
    assert_non_null(out[0][i]);
    for (int th = 1; th < 4; th++)
      assert_ptr_equal(out[th][i], out[0][i]);
  }
}

/* ---- MoE --------------------------------------------------------------- */

static void moe_compare(const refit_kernels_moe_shape_t *s) {
  refit_kernels_moe_sizes_t z;
  assert_int_equal(refit_kernels_moe_check_shape(s, "test", &z), REFIT_OK);
  int64_t E = s->num_experts, H = s->hidden, I = s->intermediate;
  int64_t m13 = s->gated ? 2 * I : I;
  uint8_t *w13 = malloc((size_t)(E * m13 * H)),
          *w13s = malloc((size_t)(E * m13 * H / 32)),
          *w2 = malloc((size_t)(E * H * I)),
          *w2s = malloc((size_t)(E * H * I / 32));
  kt_fill_bytes(w13, (size_t)(E * m13 * H));
  kt_fill_bytes(w13s, (size_t)(E * m13 * H / 32));
  kt_fill_bytes(w2, (size_t)(E * H * I));
  kt_fill_bytes(w2s, (size_t)(E * H * I / 32));
  uint8_t *got[4], *want[4];
  int64_t sz[4] = {z.w13_weight, z.w13_weight_scale, z.w2_weight,
                   z.w2_weight_scale};
  for (int i = 0; i < 4; i++) {
    got[i] = malloc((size_t)sz[i]);
    want[i] = malloc((size_t)sz[i]);
    memset(got[i], 0xEE, (size_t)sz[i]); /* stale bytes must be overwritten */
  }
  assert_int_equal(refit_kernels_moe_transform(s, w13, w13s, w2, w2s, got[0],
                                               got[1], got[2], got[3]),
                   REFIT_OK);
  assert_int_equal(refit_kernels_moe_transform_oracle(
                       s, w13, w13s, w2, w2s, want[0], want[1], want[2], want[3]),
                   REFIT_OK);
  for (int i = 0; i < 4; i++) {
    if (memcmp(got[i], want[i], (size_t)sz[i]) != 0)
      printf("moe E=%lld H=%lld I=%lld gated=%d tensor %d differs\n",
             (long long)E, (long long)H, (long long)I, s->gated, i);
    assert_memory_equal(got[i], want[i], (size_t)sz[i]);
    free(got[i]);
    free(want[i]);
  }
  free(w13);
  free(w13s);
  free(w2);
  free(w2s);
}

static void test_moe_batched_equals_oracle(void **state) {
  (void)state;
  kt_seed("test_moe_batched_equals_oracle");
  for (int iter = 0; iter < 12; iter++) {
    refit_kernels_moe_shape_t s;
    s.gated = iter % 3 != 2;
    s.num_experts = kt_rand_range(1, 5);
    s.hidden = 128 * kt_rand_range(1, 4);
    /* gated: I = 64 * odd gives I/32 = 2 * odd, so w2 scales need padding */
    s.intermediate = s.gated ? 64 * kt_rand_range(1, 7) : 128 * kt_rand_range(1, 3);
    moe_compare(&s);
  }
  /* Pinned shapes: padding of w2 scale columns (I/32 = 6 -> 8) and 2 -> 4. */
  refit_kernels_moe_shape_t pinned[] = {
      {3, 256, 192, 1}, {2, 128, 64, 1}, {2, 384, 128, 0}, {1, 2048, 768, 1}};
  for (size_t i = 0; i < sizeof(pinned) / sizeof(pinned[0]); i++)
    moe_compare(&pinned[i]);
}

/* The doc's worked rows, seen in the output values of a gated layer. */
static void test_moe_worked_rows(void **state) {
  (void)state;
  refit_kernels_moe_shape_t s = {2, 128, 128, 1};
  refit_kernels_moe_sizes_t z;
  assert_int_equal(refit_kernels_moe_check_shape(&s, "worked", &z), REFIT_OK);
  uint8_t *w13 = malloc((size_t)z.w13_weight), *w13s = calloc((size_t)(2 * 256 * 4), 1);
  uint8_t *out = malloc((size_t)z.w13_weight), *outs = malloc((size_t)z.w13_weight_scale);
  for (int64_t e = 0; e < 2; e++)
    for (int64_t r = 0; r < 256; r++)
      memset(w13 + (e * 256 + r) * 128, (int)(r & 0xff), 128);
  for (int64_t i = 0; i < 2 * 256 * 4; i++)
    w13s[i] = (uint8_t)(i / 4); /* scale row index */
  assert_int_equal(refit_kernels_moe_transform_tensor(&s, REFIT_KERNELS_MOE_W13,
                                                      w13, w13s, out, outs),
                   REFIT_OK);
  for (int64_t e = 0; e < 2; e++) {
    const uint8_t *o = out + e * 256 * 128;
    for (int i = 0; i < 8; i++) {
      assert_int_equal(o[i * 128], 128 + 2 * i);
      assert_int_equal(o[(8 + i) * 128], 2 * i);
      assert_int_equal(o[(16 + i) * 128], 129 + 2 * i);
      assert_int_equal(o[(24 + i) * 128], 1 + 2 * i);
    }
    assert_int_equal(o[255 * 128], 127);
    /* scale of output row 0, column 0 is canonical scale row 128 */
    assert_int_equal(outs[e * 256 * 4], (uint8_t)(e * 256 + 128));
  }
  free(w13);
  free(w13s);
  free(out);
  free(outs);
}

static void test_moe_shape_rules(void **state) {
  (void)state;
  struct {
    refit_kernels_moe_shape_t s;
    const char *needle;
  } bad[] = {
      {{4, 96, 128, 1}, "H % 128"},
      {{4, 128, 96, 1}, "2I % 128"},
      {{4, 128, 64, 0}, "I % 128"},
      {{0, 128, 128, 1}, "positive"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    assert_int_equal(refit_kernels_moe_check_shape(&bad[i].s, "layers.3.mlp.experts", NULL),
                     REFIT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(refit_last_error(), bad[i].needle));
    assert_non_null(strstr(refit_last_error(), "layers.3.mlp.experts"));
  }
  refit_kernels_moe_sizes_t z;
  refit_kernels_moe_shape_t q = {128, 2048, 768, 1};
  assert_int_equal(refit_kernels_moe_check_shape(&q, NULL, &z), REFIT_OK);
  assert_int_equal(z.w13_weight, 128LL * 1536 * 2048);
  assert_int_equal(z.w13_weight_scale, 128LL * 1536 * 64);
  assert_int_equal(z.w2_weight, 128LL * 2048 * 768);
  assert_int_equal(z.w2_weight_scale, 128LL * 2048 * 24);
}

/* ---- Dense ------------------------------------------------------------- */

/* Step by step: pad rows (trtllm), shuffle by dst32 scatter, swizzle. */
static void oracle_dense(refit_kernels_dense_backend_t b, int64_t n, int64_t k,
                         const uint8_t *q, const uint8_t *s, uint8_t *wo,
                         uint8_t *so) {
  int64_t cols = k / 32;
  if (b != REFIT_KERNELS_DENSE_FLASHINFER_TRTLLM) {
    memcpy(wo, q, (size_t)(n * k));
    oracle_swizzle(s, n, cols, so);
    return;
  }
  int64_t np = refit_round_up(n, 128);
  uint8_t *pq = calloc((size_t)(np * k), 1), *ps = calloc((size_t)(np * cols), 1);
  uint8_t *ss = malloc((size_t)(np * cols));
  memcpy(pq, q, (size_t)(n * k));
  memcpy(ps, s, (size_t)(n * cols));
  for (int64_t r = 0; r < np; r++) {
    int64_t d = refit_kernels_perm_index(REFIT_KERNELS_PERM_DST32, np, r);
    memcpy(wo + d * k, pq + r * k, (size_t)k);
    memcpy(ss + d * cols, ps + r * cols, (size_t)cols);
  }
  oracle_swizzle(ss, np, cols, so);
  free(pq);
  free(ps);
  free(ss);
}

static void test_dense_backends(void **state) {
  (void)state;
  kt_seed("test_dense_backends");
  for (int iter = 0; iter < 30; iter++) {
    refit_kernels_dense_backend_t b = (refit_kernels_dense_backend_t)(iter % 3);
    int64_t n = kt_rand_range(1, 400);
    if (iter % 5 == 0)
      n = 128 * kt_rand_range(1, 3);
    int64_t k = b == REFIT_KERNELS_DENSE_FLASHINFER_TRTLLM ? 256 * kt_rand_range(1, 4)
                                                          : 32 * kt_rand_range(1, 20);
    int64_t wb, sb;
    assert_int_equal(refit_kernels_dense_sizes(b, n, k, &wb, &sb), REFIT_OK);
    assert_int_equal(sb, refit_round_up(n, 128) * refit_round_up(k / 32, 4));
    assert_int_equal(wb, (b == REFIT_KERNELS_DENSE_FLASHINFER_TRTLLM
                              ? refit_round_up(n, 128)
                              : n) * k);
    uint8_t *q = malloc((size_t)(n * k)), *s = malloc((size_t)(n * k / 32));
    uint8_t *wo = malloc((size_t)wb), *so = malloc((size_t)sb);
    uint8_t *ww = malloc((size_t)wb), *sw = malloc((size_t)sb);
    kt_fill_bytes(q, (size_t)(n * k));
    kt_fill_bytes(s, (size_t)(n * k / 32));
    memset(wo, 0xEE, (size_t)wb);
    memset(so, 0xEE, (size_t)sb);
    assert_int_equal(refit_kernels_dense_transform(b, n, k, q, s, wo, so), REFIT_OK);
    oracle_dense(b, n, k, q, s, ww, sw);
    if (memcmp(wo, ww, (size_t)wb) != 0 || memcmp(so, sw, (size_t)sb) != 0)
      printf("dense %s N=%lld K=%lld differs\n",
             refit_kernels_dense_backend_name(b), (long long)n, (long long)k);
    assert_memory_equal(wo, ww, (size_t)wb);
    assert_memory_equal(so, sw, (size_t)sb);
    free(q);
    free(s);
    free(wo);
    free(so);
    free(ww);
    free(sw);
  }
}

static void test_dense_shape_rules(void **state) {
  (void)state;
  assert_int_equal(refit_kernels_check_shape(REFIT_KERNELS_DENSE_FLASHINFER_TRTLLM,
                                             "model.layers.0.self_attn.o_proj", 2048,
                                             1664),
                   REFIT_ERR_INVALID_ARGUMENT);
  const char *msg = refit_last_error();
  assert_non_null(strstr(msg, "model.layers.0.self_attn.o_proj"));
  assert_non_null(strstr(msg, "K % 256 == 0"));
  assert_non_null(strstr(msg, "flashinfer_trtllm"));
  assert_int_equal(refit_kernels_check_shape(REFIT_KERNELS_DENSE_FLASHINFER_CUTLASS,
                                             "x", 100, 1664),
                   REFIT_OK);
  assert_int_equal(refit_kernels_check_shape(REFIT_KERNELS_DENSE_FLASHINFER_CUTEDSL,
                                             "x", 100, 48),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(refit_last_error(), "K % 32 == 0"));
  assert_int_equal(refit_kernels_check_shape(REFIT_KERNELS_DENSE_COUNT, "x", 128, 256),
                   REFIT_ERR_INVALID_ARGUMENT);
  refit_kernels_dense_backend_t b;
  for (int i = 0; i < REFIT_KERNELS_DENSE_COUNT; i++) {
    assert_int_equal(refit_kernels_dense_backend_parse(
                         refit_kernels_dense_backend_name((refit_kernels_dense_backend_t)i), &b),
                     REFIT_OK);
    assert_int_equal(b, i);
  }
  assert_int_equal(refit_kernels_dense_backend_parse("cutlass", &b),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(REFIT_KERNELS_DENSE_DEFAULT, REFIT_KERNELS_DENSE_FLASHINFER_CUTLASS);
  uint8_t buf[1];
  assert_int_equal(refit_kernels_dense_transform(REFIT_KERNELS_DENSE_FLASHINFER_TRTLLM,
                                                 128, 288, buf, buf, buf, buf),
                   REFIT_ERR_INVALID_ARGUMENT);
}

static int teardown_cache(void **state) {
  (void)state;
  refit_kernels_perm_cache_clear();
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_swizzle_worked_offsets),
      cmocka_unit_test(test_swizzle_random_stacks),
      cmocka_unit_test(test_permutations),
      cmocka_unit_test(test_perm_cache_threads),
      cmocka_unit_test(test_moe_batched_equals_oracle),
      cmocka_unit_test(test_moe_worked_rows),
      cmocka_unit_test(test_moe_shape_rules),
      cmocka_unit_test(test_dense_backends),
      cmocka_unit_test(test_dense_shape_rules),
  };
  return cmocka_run_group_tests(tests, NULL, teardown_cache);
}

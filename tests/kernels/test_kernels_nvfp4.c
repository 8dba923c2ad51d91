/*
 * NVFP4 C reference: its argument rules, a worked block, strided input and
 * output, bytes that do not depend on the number of worker threads, and the
 * shard rule (a tensor's amax key is the maximum of its shards' keys, and
 * shards cut on block boundaries quantize under the whole tensor's global
 * scale to the whole tensor's bytes), and the NVFP4 MoE expert layouts of
 * both FlashInfer backends; the CUDA twin's float-arithmetic E2M1 encoder
 * equal to the reference's. The rule itself is checked against an
 * independent statement in Python (tests/reference/test_nvfp4_kernel.py).
 */
#include "kernels/layout.h"
#include "kernels/mxfp8.h" /* refit_kernels_threads_set */
#include "kernels/nvfp4.h"
#include "kernels/nvfp4_rules.h"
#include "nvfp4_scenario.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
/* cmocka.h needs the headers above first. */
#include <cmocka.h>

static void test_nvfp4_arguments(void **state) {
  (void)state;
  /* 6, 3, -0.5, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -6, 0, -0, 8, 0.1, 4 */
  const uint16_t x[16] = {0x40c0, 0x4040, 0xbf00, 0x3e80, 0x3f40, 0x3fa0, 0x3fe0, 0x4020,
                          0x4060, 0x40a0, 0xc0c0, 0x0000, 0x8000, 0x4100, 0x3dcd, 0x4080};
  uint8_t q[8], sf[1];
  memset(q, 0xAA, sizeof(q));
  sf[0] = 0xAA;
  assert_int_equal(refit_nvfp4_quantize(x, -1, 16, 16, 1.0f, q, 8, sf, 1),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_nvfp4_quantize(x, 1, 16, 15, 1.0f, q, 8, sf, 1),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_nvfp4_quantize(x, 1, 16, 16, 1.0f, q, 7, sf, 1),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_nvfp4_quantize(x, 1, 16, 16, 1.0f, q, 8, sf, 0),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_nvfp4_quantize(NULL, 1, 16, 16, 1.0f, q, 8, sf, 1),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_nvfp4_quantize(x, 1, 16, 16, 0.0f, q, 8, sf, 1),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_nvfp4_quantize(x, 1, 16, 16, -2.0f, q, 8, sf, 1),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_nvfp4_quantize(x, 1, 16, 16, __builtin_nanf(""), q, 8, sf, 1),
                   REFIT_ERR_INVALID_ARGUMENT);
  /* Nothing written on an error. */
  assert_int_equal(q[0], 0xAA);
  assert_int_equal(sf[0], 0xAA);
  /* Empty shapes are a no-op, NULL buffers allowed. */
  assert_int_equal(refit_nvfp4_quantize(NULL, 0, 16, 16, 1.0f, NULL, 8, NULL, 1),
                   REFIT_OK);
  /* Under gsf 1 the block of amax 8 has sf e4m3(8/6) = 1.375 (0x3B) and
   * out = 1/1.375: 6 -> 4.36 -> 4, 3 -> 2.18 -> 2, 8 -> 5.8 -> 6, 0.1 -> 0. */
  assert_int_equal(refit_nvfp4_quantize(x, 1, 16, 16, 1.0f, q, 8, sf, 1), REFIT_OK);
  assert_int_equal(sf[0], 0x3B);
  assert_int_equal(q[0], 0x46);       /* 3 -> 2 (code 4) high, 6 -> 4 (code 6) low */
  assert_int_equal(q[6] & 0x0f, 0x8); /* -0 keeps its sign */
  assert_int_equal(q[6] >> 4, 0x7);   /* 8 -> 5.82 -> 6 */
  assert_int_equal(q[7] & 0x0f, 0x0); /* 0.1 -> 0.07 -> 0 */
  /* The amax key ignores NaN; the global scale of 2688 is 1. */
  const uint16_t y[3] = {0xffc0, 0xc528, 0x4000}; /* NaN, -2688, 2 */
  refit_status_t st;
  assert_int_equal(refit_nvfp4_amax_key(y, 1, 3, 3, &st), 0x4528);
  assert_int_equal(st, REFIT_OK);
  assert_true(refit_nvfp4_global_scale(0x4528) == 1.0f);
  assert_int_equal(refit_nvfp4_amax_key(y, 1, 3, 2, &st), 0);
  assert_int_equal(st, REFIT_ERR_INVALID_ARGUMENT);
}

/* Strided input and output give the contiguous bytes; padding untouched. */
static void test_nvfp4_strides(void **state) {
  (void)state;
  const int64_t rows = 70, k = 261, sk = 300, qk = 140, sfk = 20;
  const int64_t qb = refit_nvfp4_row_bytes(k), nb = refit_nvfp4_scale_cols(k);
  uint16_t *wide = malloc((size_t)(rows * sk) * 2), *x = malloc((size_t)(rows * k) * 2);
  uint8_t *q0 = malloc((size_t)(rows * qb)), *q1 = malloc((size_t)(rows * qk));
  uint8_t *s0 = malloc((size_t)(rows * nb)), *s1 = malloc((size_t)(rows * sfk));
  nvs_fill(wide, rows, sk);
  for (int64_t r = 0; r < rows; r++)
    memcpy(x + r * k, wide + r * sk, (size_t)k * 2);
  memset(q1, 0x5A, (size_t)(rows * qk));
  memset(s1, 0xA5, (size_t)(rows * sfk));
  const float gsf = refit_nvfp4_global_scale(refit_nvfp4_amax_key(x, rows, k, k, NULL));
  assert_int_equal(refit_nvfp4_quantize(x, rows, k, k, gsf, q0, qb, s0, nb), REFIT_OK);
  assert_int_equal(refit_nvfp4_quantize(wide, rows, k, sk, gsf, q1, qk, s1, sfk),
                   REFIT_OK);
  for (int64_t r = 0; r < rows; r++) {
    assert_memory_equal(q0 + r * qb, q1 + r * qk, (size_t)qb);
    assert_int_equal(q1[r * qk + qb], 0x5A);
    assert_memory_equal(s0 + r * nb, s1 + r * sfk, (size_t)nb);
    assert_int_equal(s1[r * sfk + nb], 0xA5);
    assert_int_equal(q0[r * qb + qb - 1] >> 4, 0); /* odd K: high nibble 0 */
  }
  free(wide);
  free(x);
  free(q0);
  free(q1);
  free(s0);
  free(s1);
}

/* One thread and several give the same bytes. */
static void test_nvfp4_threads(void **state) {
  (void)state;
  const int64_t rows = 900, k = 4096;
  const int64_t qb = refit_nvfp4_row_bytes(k), nb = refit_nvfp4_scale_cols(k);
  uint16_t *x = malloc((size_t)(rows * k) * 2);
  uint8_t *q0 = malloc((size_t)(rows * qb)), *q1 = malloc((size_t)(rows * qb));
  uint8_t *s0 = malloc((size_t)(rows * nb)), *s1 = malloc((size_t)(rows * nb));
  nvs_fill(x, rows, k);
  const float gsf = 3.0f;
  refit_kernels_threads_set(1);
  assert_int_equal(refit_nvfp4_quantize(x, rows, k, k, gsf, q0, qb, s0, nb), REFIT_OK);
  refit_kernels_threads_set(4);
  assert_int_equal(refit_nvfp4_quantize(x, rows, k, k, gsf, q1, qb, s1, nb), REFIT_OK);
  refit_kernels_threads_set(0);
  assert_memory_equal(q0, q1, (size_t)(rows * qb));
  assert_memory_equal(s0, s1, (size_t)(rows * nb));
  free(x);
  free(q0);
  free(q1);
  free(s0);
  free(s1);
}

/* A [96, 320] tensor in 3 x 4 shards, none holding it whole: the maximum of
 * the shards' keys is the tensor's key, and each shard quantized under the
 * tensor's global scale is its slice of the tensor's bytes. */
static void test_nvfp4_shards(void **state) {
  (void)state;
  const int64_t rows = 96, k = 320, qb = k / 2, nb = k / 16;
  uint16_t *x = malloc((size_t)(rows * k) * 2);
  uint8_t *q = malloc((size_t)(rows * qb)), *s = malloc((size_t)(rows * nb));
  uint8_t qs[32 * 40], ss[32 * 5];
  nvs_fill(x, rows, k);
  for (int64_t i = 0; i < rows * k; i++) /* finite, so one block holds the amax */
    if ((x[i] & 0x7fff) >= 0x7f80)
      x[i] = 0x3f80;
  x[kt_rand_range(0, rows * k - 1)] = 0x4480; /* 1024, above the rest */
  const uint16_t key = refit_nvfp4_amax_key(x, rows, k, k, NULL);
  const float gsf = refit_nvfp4_global_scale(key);
  assert_int_equal(refit_nvfp4_quantize(x, rows, k, k, gsf, q, qb, s, nb), REFIT_OK);
  uint16_t shard_max = 0;
  int own_differs = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += 32)
    for (int64_t c0 = 0; c0 < k; c0 += 80) {
      const uint16_t *p = x + r0 * k + c0;
      const uint16_t kk = refit_nvfp4_amax_key(p, 32, 80, k, NULL);
      shard_max = kk > shard_max ? kk : shard_max;
      assert_int_equal(refit_nvfp4_quantize(p, 32, 80, k, gsf, qs, 40, ss, 5), REFIT_OK);
      for (int64_t r = 0; r < 32; r++) {
        assert_memory_equal(qs + r * 40, q + (r0 + r) * qb + c0 / 2, 40);
        assert_memory_equal(ss + r * 5, s + (r0 + r) * nb + c0 / 16, 5);
      }
      /* The shard's own global scale would give other bytes (the collective
       * is needed) wherever the shard does not hold the tensor's amax. */
      if (kk != key) {
        assert_int_equal(refit_nvfp4_quantize(p, 32, 80, k, refit_nvfp4_global_scale(kk),
                                              qs, 40, ss, 5),
                         REFIT_OK);
        for (int64_t r = 0; r < 32 && !own_differs; r++)
          own_differs = memcmp(ss + r * 5, s + (r0 + r) * nb + c0 / 16, 5) != 0;
      }
    }
  assert_int_equal(shard_max, key);
  assert_true(own_differs);
  free(x);
  free(q);
  free(s);
}

/* FlashInfer's 32-row epilogue-tile map (srcToDstBlk32RowMap): source row i
 * of a block lands on row kBlk32[i]. Written out here, not taken from
 * kernels/layout.h. */
static const int kBlk32[32] = {0,  8,  16, 24, 1,  9,  17, 25, 2,  10, 18,
                               26, 3,  11, 19, 27, 4,  12, 20, 28, 5,  13,
                               21, 29, 6,  14, 22, 30, 7,  15, 23, 31};

/* The input row that output row j of an expert takes, step by step as vLLM
 * and FlashInfer state it: [gate; up] -> [up; gate] (reorder_w1w3_to_w3w1),
 * then for TRTLLM the gated interleave (rows 2i, 2i+1 <- i, m/2 + i) and the
 * shuffle (output row (r/32)*32 + kBlk32[r%32] <- row r). */
static int64_t nvfp4_moe_source_row(int trtllm, int w13, int64_t m, int64_t j) {
  int64_t r = j;
  if (trtllm) {
    for (int64_t old = 0; old < m; old++)
      if ((old / 32) * 32 + kBlk32[old % 32] == j)
        r = old;
  }
  if (trtllm && w13)
    r = r % 2 == 0 ? r / 2 : m / 2 + r / 2;
  if (w13)
    r = r < m / 2 ? m / 2 + r : r - m / 2;
  return r;
}

/* Both backends' expert layouts on tagged rows: every output row holds the
 * input row the rules name, and every scale its row's tag at the 128x4
 * offset (kernels/layout.h); the shape rules refuse what vLLM would pad. */
static void test_nvfp4_moe_layout(void **state) {
  (void)state;
  const refit_kernels_moe_shape_t s = {2, 256, 64, 1};
  for (int trtllm = 0; trtllm <= 1; trtllm++) {
    const refit_kernels_moe_backend_t b = trtllm ? REFIT_KERNELS_MOE_FLASHINFER_TRTLLM
                                                 : REFIT_KERNELS_MOE_FLASHINFER_CUTLASS;
    for (int w13 = 0; w13 <= 1; w13++) {
      const int64_t m = w13 ? 2 * s.intermediate : s.hidden;
      const int64_t k = w13 ? s.hidden : s.intermediate, rb = k / 2, kb = k / 16;
      const int64_t kp = (kb + 3) / 4 * 4, mp = (m + 127) / 128 * 128;
      uint8_t *packed = malloc((size_t)(s.num_experts * m * rb));
      uint8_t *lin = malloc((size_t)(s.num_experts * m * kb));
      uint8_t *w_out = malloc((size_t)(s.num_experts * m * rb));
      uint8_t *s_out = calloc((size_t)(s.num_experts * mp * kp), 1);
      assert_non_null(packed);
      assert_non_null(lin);
      assert_non_null(w_out);
      assert_non_null(s_out);
      for (int64_t e = 0; e < s.num_experts; e++)
        for (int64_t r = 0; r < m; r++) {
          memset(packed + (e * m + r) * rb, (int)((r + 7 * e) & 0xff), (size_t)rb);
          for (int64_t c = 0; c < kb; c++)
            lin[(e * m + r) * kb + c] = (uint8_t)((r * 3 + c + e) & 0xff);
        }
      assert_int_equal(refit_kernels_nvfp4_moe_transform(
                           b, &s, w13 ? REFIT_KERNELS_MOE_W13 : REFIT_KERNELS_MOE_W2,
                           packed, lin, w_out, s_out),
                       REFIT_OK);
      for (int64_t e = 0; e < s.num_experts; e++)
        for (int64_t j = 0; j < m; j++) {
          const int64_t r = nvfp4_moe_source_row(trtllm, w13, m, j);
          assert_int_equal(w_out[(e * m + j) * rb], (r + 7 * e) & 0xff);
          assert_int_equal(w_out[(e * m + j) * rb + rb - 1], (r + 7 * e) & 0xff);
          for (int64_t c = 0; c < kb; c++)
            assert_int_equal(s_out[e * mp * kp + refit_kernels_swizzle_offset(j, c, kp)],
                             (r * 3 + c + e) & 0xff);
        }
      free(packed);
      free(lin);
      free(w_out);
      free(s_out);
    }
  }
  /* H 320: CUTLASS serves it, TRTLLM would pad it to 512. */
  const refit_kernels_moe_shape_t h320 = {2, 320, 64, 1};
  assert_int_equal(refit_kernels_nvfp4_moe_check_shape(
                       REFIT_KERNELS_MOE_FLASHINFER_CUTLASS, &h320, "x"),
                   REFIT_OK);
  assert_int_equal(refit_kernels_nvfp4_moe_check_shape(
                       REFIT_KERNELS_MOE_FLASHINFER_TRTLLM, &h320, "x"),
                   REFIT_ERR_INVALID_ARGUMENT);
  /* I 48: 2I = 96 is no multiple of 128 for either; I 40: no multiple of 16. */
  const refit_kernels_moe_shape_t i48 = {2, 256, 48, 1}, i40 = {2, 256, 40, 1};
  for (int b = 0; b <= 1; b++) {
    assert_int_equal(
        refit_kernels_nvfp4_moe_check_shape((refit_kernels_moe_backend_t)b, &i48, "x"),
        REFIT_ERR_INVALID_ARGUMENT);
    assert_int_equal(
        refit_kernels_nvfp4_moe_check_shape((refit_kernels_moe_backend_t)b, &i40, "x"),
        REFIT_ERR_INVALID_ARGUMENT);
  }
}

/* Stacked matrices, each under its own global scale: the bytes of one
 * refit_nvfp4_quantize per matrix, and their decode scales; a bad scale
 * refuses the call by its matrix. */
static void test_nvfp4_groups(void **state) {
  (void)state;
  enum { G = 5, ROWS = 7, K = 40, SK = 48, QB = 20, NB = 3 };
  uint16_t *x = malloc(sizeof(uint16_t) * G * ROWS * SK);
  nvs_fill(x, G * ROWS, SK);
  float gsf[G], decode[G];
  uint8_t q0[G * ROWS * QB], s0[G * ROWS * NB], q1[G * ROWS * QB], s1[G * ROWS * NB];
  for (int g = 0; g < G; g++) {
    gsf[g] = g == 3 ? __builtin_inff()
                    : refit_nvfp4_global_scale(
                          refit_nvfp4_amax_key(x + g * ROWS * SK, ROWS, K, SK, NULL));
    assert_int_equal(refit_nvfp4_quantize(x + g * ROWS * SK, ROWS, K, SK, gsf[g],
                                          q0 + g * ROWS * QB, QB, s0 + g * ROWS * NB, NB),
                     REFIT_OK);
  }
  assert_int_equal(
      refit_nvfp4_quantize_groups(x, G, ROWS, K, SK, gsf, q1, QB, s1, NB, decode),
      REFIT_OK);
  assert_memory_equal(q0, q1, sizeof(q0));
  assert_memory_equal(s0, s1, sizeof(s0));
  for (int g = 0; g < G; g++)
    assert_true(decode[g] == refit_nvfp4_global_decode(gsf[g]));
  gsf[2] = 0.0f;
  assert_int_equal(
      refit_nvfp4_quantize_groups(x, G, ROWS, K, SK, gsf, q1, QB, s1, NB, NULL),
      REFIT_ERR_INVALID_ARGUMENT);
  free(x);
}

/* refit_nvfp4_e2m1_finite == refit_nvfp4_e2m1 (the CUDA twin's encoder and
 * the reference's) on every float within 2^16 ulps of each E2M1 value and
 * midpoint, of both signs, and on every 65537th bit pattern (an exhaustive
 * run over all 2^32 agreed when the encoder was written). */
static void test_nvfp4_e2m1_finite(void **state) {
  (void)state;
  static const float points[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f,
                                 2.0f, 2.5f,  3.0f, 3.5f,  4.0f, 5.0f,  6.0f};
  for (size_t i = 0; i < sizeof(points) / sizeof(points[0]); i++)
    for (uint32_t sign = 0; sign < 2; sign++)
      for (int64_t d = -65536; d <= 65536; d++) {
        const int64_t at = (int64_t)refit_f32_bits(points[i]) + d;
        if (at < 0)
          continue;
        const float v = refit_f32_from_bits((uint32_t)at | sign << 31);
        if (refit_nvfp4_e2m1_finite(v) != refit_nvfp4_e2m1(v)) {
          printf("0x%08x (%g): finite %u, reference %u\n", refit_f32_bits(v), (double)v,
                 refit_nvfp4_e2m1_finite(v), refit_nvfp4_e2m1(v));
          fail();
        }
      }
  for (uint64_t u = 0; u <= 0xffffffffu; u += 65537) {
    const float v = refit_f32_from_bits((uint32_t)u);
    if (v == v)
      assert_int_equal(refit_nvfp4_e2m1_finite(v), refit_nvfp4_e2m1(v));
  }
}

int main(void) {
  kt_seed("test_kernels_nvfp4");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nvfp4_arguments),  cmocka_unit_test(test_nvfp4_strides),
      cmocka_unit_test(test_nvfp4_threads),    cmocka_unit_test(test_nvfp4_shards),
      cmocka_unit_test(test_nvfp4_moe_layout), cmocka_unit_test(test_nvfp4_e2m1_finite),
      cmocka_unit_test(test_nvfp4_groups),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * Block FP8 C reference: its argument rules, strided input and output, and
 * bytes that do not depend on the number of worker threads. The rule itself
 * is checked against an independent statement in Python
 * (tests/reference/test_fp8_block_kernel.py).
 */
#include "fp8_block_scenario.h"
#include "kernels/fp8_block.h"
#include "kernels/mxfp8.h" /* refit_kernels_threads_set */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

static void test_fp8_block_arguments(void **state) {
  (void)state;
  uint16_t x[4] = {0x3f80, 0x4000, 0x4040, 0x4080};
  uint8_t q[4] = {0xAA, 0xAA, 0xAA, 0xAA};
  float s[1] = {-1.0f};
  assert_int_equal(
      refit_fp8_block_quantize(x, -1, 4, 4, REFIT_FP8_SCALE_FP32, q, 4, s, 1),
      REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_fp8_block_quantize(x, 1, 4, 3, REFIT_FP8_SCALE_FP32, q, 4, s, 1),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_fp8_block_quantize(x, 1, 4, 4, REFIT_FP8_SCALE_FP32, q, 3, s, 1),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_fp8_block_quantize(x, 1, 4, 4, REFIT_FP8_SCALE_FP32, q, 4, s, 0),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_fp8_block_quantize(x, 1, 4, 4, (refit_fp8_scale_t)7, q, 4, s, 1),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(
      refit_fp8_block_quantize(NULL, 1, 4, 4, REFIT_FP8_SCALE_FP32, q, 4, s, 1),
      REFIT_ERR_INVALID_ARGUMENT);
  /* Nothing written on an error. */
  assert_int_equal(q[0], 0xAA);
  assert_true(s[0] == -1.0f);
  /* Empty shapes are a no-op, NULL buffers allowed. */
  assert_int_equal(
      refit_fp8_block_quantize(NULL, 0, 4, 4, REFIT_FP8_SCALE_POW2, NULL, 4, NULL, 1),
      REFIT_OK);
  /* 1..4 with amax 4: fp32 scale 112, pow2 scale 2^6 (4/448 rounds up to 2^-6). */
  assert_int_equal(refit_fp8_block_quantize(x, 1, 4, 4, REFIT_FP8_SCALE_FP32, q, 4, s, 1),
                   REFIT_OK);
  assert_true(s[0] == 1.0f / 112.0f);
  assert_int_equal(q[3], 0x7E); /* 448 */
  assert_int_equal(refit_fp8_block_quantize(x, 1, 4, 4, REFIT_FP8_SCALE_POW2, q, 4, s, 1),
                   REFIT_OK);
  assert_true(s[0] == 1.0f / 64.0f);
  assert_int_equal(q[3], 0x78); /* 256 */
}

/* A sub-matrix read with strides and written with strides gives the bytes of
 * the same matrix quantized contiguously; the padding bytes of the strided
 * outputs stay untouched. */
static void test_fp8_block_strides(void **state) {
  (void)state;
  const int64_t rows = 300, k = 260, sk = 301, qk = 270;
  const int64_t nbr = refit_fp8_block_count(rows), nbc = refit_fp8_block_count(k);
  uint16_t *wide = malloc((size_t)(rows * sk) * 2), *x = malloc((size_t)(rows * k) * 2);
  uint8_t *q0 = malloc((size_t)(rows * k)), *q1 = malloc((size_t)(rows * qk));
  float *s0 = malloc((size_t)(nbr * nbc) * 4), *s1 = malloc((size_t)(nbr * 5) * 4);
  fbs_fill(wide, rows, sk, 0);
  for (int64_t r = 0; r < rows; r++)
    memcpy(x + r * k, wide + r * sk, (size_t)k * 2);
  memset(q1, 0x5A, (size_t)(rows * qk));
  for (int64_t i = 0; i < nbr * 5; i++)
    s1[i] = -2.0f;
  for (int mode = 0; mode < 2; mode++) {
    assert_int_equal(
        refit_fp8_block_quantize(x, rows, k, k, (refit_fp8_scale_t)mode, q0, k, s0, nbc),
        REFIT_OK);
    assert_int_equal(refit_fp8_block_quantize(wide, rows, k, sk, (refit_fp8_scale_t)mode,
                                              q1, qk, s1, 5),
                     REFIT_OK);
    for (int64_t r = 0; r < rows; r++) {
      assert_memory_equal(q0 + r * k, q1 + r * qk, (size_t)k);
      for (int64_t c = k; c < qk; c++)
        assert_int_equal(q1[r * qk + c], 0x5A);
    }
    for (int64_t b = 0; b < nbr; b++) {
      assert_memory_equal(s0 + b * nbc, s1 + b * 5, (size_t)nbc * 4);
      assert_true(s1[b * 5 + 3] == -2.0f && s1[b * 5 + 4] == -2.0f);
    }
  }
  free(wide);
  free(x);
  free(q0);
  free(q1);
  free(s0);
  free(s1);
}

/* The same bytes on one thread and on several (a matrix above the threads'
 * threshold, with a band wider than 64 block columns). */
static void test_fp8_block_threads(void **state) {
  (void)state;
  const int64_t rows = 700, k = 8400;
  const int64_t nbr = refit_fp8_block_count(rows), nbc = refit_fp8_block_count(k);
  uint16_t *x = malloc((size_t)(rows * k) * 2);
  uint8_t *q0 = malloc((size_t)(rows * k)), *q1 = malloc((size_t)(rows * k));
  float *s0 = malloc((size_t)(nbr * nbc) * 4), *s1 = malloc((size_t)(nbr * nbc) * 4);
  fbs_fill(x, rows, k, 1);
  for (int mode = 0; mode < 2; mode++) {
    refit_kernels_threads_set(1);
    assert_int_equal(
        refit_fp8_block_quantize(x, rows, k, k, (refit_fp8_scale_t)mode, q0, k, s0, nbc),
        REFIT_OK);
    refit_kernels_threads_set(4);
    assert_int_equal(
        refit_fp8_block_quantize(x, rows, k, k, (refit_fp8_scale_t)mode, q1, k, s1, nbc),
        REFIT_OK);
    assert_memory_equal(q0, q1, (size_t)(rows * k));
    assert_memory_equal(s0, s1, (size_t)(nbr * nbc) * 4);
  }
  refit_kernels_threads_set(0);
  free(x);
  free(q0);
  free(q1);
  free(s0);
  free(s1);
}

int main(void) {
  kt_seed("test_kernels_fp8_block");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fp8_block_arguments),
      cmocka_unit_test(test_fp8_block_strides),
      cmocka_unit_test(test_fp8_block_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

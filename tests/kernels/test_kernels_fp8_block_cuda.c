/*
 * The block FP8 CUDA twin == the C reference, byte for byte and bit for bit
 * (E4M3 values and FP32 scale_inv): adversarial blocks in both scale modes,
 * partial blocks, NaN blocks, strided and unaligned buffers.
 * Exits 77 (skipped) without a GPU.
 */
#include "fp8_block_scenario.h"
#include "kernels/fp8_block_cuda.h"

#include <cuda_runtime_api.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h> /* after setjmp.h and stdarg.h */

#define CK(call) assert_int_equal((int)(call), (int)cudaSuccess)

/* rows x k from a source of row stride sk, src shifted by `shift` elements
 * and q by `shift` bytes on the device (0: aligned). */
static void compare(int64_t rows, int64_t k, int64_t sk, int shift, int mode) {
  const int64_t nbr = refit_fp8_block_count(rows), nbc = refit_fp8_block_count(k);
  const size_t n = (size_t)(rows * sk), nq = (size_t)(rows * k), ns = (size_t)(nbr * nbc);
  uint16_t *x = malloc(n * 2);
  uint8_t *q = malloc(nq), *hq = malloc(nq);
  float *s = malloc(ns * 4), *hs = malloc(ns * 4);
  fbs_fill(x, rows, sk, 1);
  assert_int_equal(
      refit_fp8_block_quantize(x, rows, k, sk, (refit_fp8_scale_t)mode, q, k, s, nbc),
      REFIT_OK);
  uint16_t *dx = NULL;
  uint8_t *dq = NULL;
  float *ds = NULL;
  CK(cudaMalloc((void **)&dx, (n + 8) * 2));
  CK(cudaMalloc((void **)&dq, nq + 8));
  CK(cudaMalloc((void **)&ds, ns * 4));
  CK(cudaMemcpy(dx + shift, x, n * 2, cudaMemcpyHostToDevice));
  assert_int_equal(refit_fp8_block_quantize_cuda(dx + shift, rows, k, sk,
                                                 (refit_fp8_scale_t)mode, dq + shift, k,
                                                 ds, nbc, 0),
                   REFIT_OK);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(hq, dq + shift, nq, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hs, ds, ns * 4, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < nq; i++)
    if (q[i] != hq[i]) {
      printf(
          "[%lld, %lld] mode %d shift %d: first value diff at (%lld, %lld): x = 0x%04x "
          "cpu 0x%02x gpu 0x%02x\n",
          (long long)rows, (long long)k, mode, shift, (long long)(i / (size_t)k),
          (long long)(i % (size_t)k), x[(i / (size_t)k) * (size_t)sk + i % (size_t)k],
          q[i], hq[i]);
      fail();
    }
  assert_memory_equal(s, hs, ns * 4);
  /* The dequantization of the same bytes (MLA's W_UK_T / W_UV buffer). */
  uint16_t *y = malloc(nq * 2), *hy = malloc(nq * 2), *dy = NULL;
  assert_int_equal(refit_fp8_block_dequantize(q, rows, k, k, s, nbc, y, k), REFIT_OK);
  CK(cudaMalloc((void **)&dy, nq * 2 + 16));
  assert_int_equal(
      refit_fp8_block_dequantize_cuda(dq + shift, rows, k, k, ds, nbc, dy + shift, k, 0),
      REFIT_OK);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(hy, dy + shift, nq * 2, cudaMemcpyDeviceToHost));
  assert_memory_equal(y, hy, nq * 2);
  CK(cudaFree(dy));
  free(y);
  free(hy);
  CK(cudaFree(dx));
  CK(cudaFree(dq));
  CK(cudaFree(ds));
  free(x);
  free(q);
  free(hq);
  free(s);
  free(hs);
}

static void test_cuda_fp8_block(void **state) {
  (void)state;
  static const int64_t shapes[][3] = {{128, 128, 128},
                                      {1280, 1152, 1152},
                                      {200, 130, 130},
                                      {130, 257, 300},
                                      {1, 1, 1},
                                      {300, 8400, 8400},
                                      /* whole blocks, a padded row stride
                                       * (16-byte rows) and an odd one */
                                      {256, 384, 392},
                                      {256, 256, 260}};
  for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
    for (int mode = 0; mode < 2; mode++)
      for (int shift = 0; shift < 2; shift++)
        compare(shapes[i][0], shapes[i][1], shapes[i][2], shift, mode);
}

int main(void) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    printf("test_kernels_fp8_block_cuda: no CUDA device, skipped\n");
    return 77;
  }
  kt_seed("test_kernels_fp8_block_cuda");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cuda_fp8_block),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * CUDA twins == C reference, byte for byte: quantization on random data, on
 * every BF16 value under every reachable scale (the blocks of the exhaustive
 * C test), on adversarial blocks, with aligned and unaligned buffers; the
 * swizzle, the MoE layer transform (batched, and the step-by-step GPU oracle)
 * and the dense backends on random shapes, the swizzle and the MoE transform
 * also with unaligned buffers.
 * Exits 77 (skipped) without a GPU.
 */
#include "kernels/mxfp8_cuda.h"
#include "kernels_test.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

#define CK(call) assert_int_equal((int)(call), (int)cudaSuccess)

static void *dev_from(const void *host, size_t n) {
  void *d = NULL;
  CK(cudaMalloc(&d, n + 64));
  if (host != NULL)
    CK(cudaMemcpy(d, host, n, cudaMemcpyHostToDevice));
  return d;
}

static void *host_from(const void *dev, size_t n) {
  void *h = malloc(n);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(h, dev, n, cudaMemcpyDeviceToHost));
  return h;
}

static int64_t count_diff(const uint8_t *a, const uint8_t *b, size_t n) {
  int64_t d = 0;
  for (size_t i = 0; i < n; i++)
    d += a[i] != b[i];
  return d;
}

/* Quantize on both sides with src offset by `shift` elements (0: aligned). */
static void quantize_compare(const uint16_t *src, int64_t rows, int64_t k,
                             int shift) {
  size_t n = (size_t)(rows * k);
  uint8_t *q = malloc(n), *s = malloc(n / 32);
  assert_int_equal(refit_mxfp8_quantize_rows(src, rows, k, k, q, k, s, k / 32),
                   REFIT_OK);
  uint16_t *dsrc = dev_from(NULL, (n + 8) * 2);
  CK(cudaMemcpy(dsrc + shift, src, n * 2, cudaMemcpyHostToDevice));
  uint8_t *dq = dev_from(NULL, n + 8), *ds = dev_from(NULL, n / 32);
  assert_int_equal(refit_mxfp8_quantize_rows_cuda(dsrc + shift, rows, k, k,
                                                  dq + shift, k, ds, k / 32, 0),
                   REFIT_OK);
  uint8_t *hq = malloc(n);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(hq, dq + shift, n, cudaMemcpyDeviceToHost));
  uint8_t *hs = host_from(ds, n / 32);
  int64_t dq_bad = count_diff(q, hq, n), ds_bad = count_diff(s, hs, n / 32);
  if (dq_bad || ds_bad) {
    for (size_t i = 0; i < n; i++)
      if (q[i] != hq[i]) {
        printf("first q diff at %zu: x = 0x%04x scale %d: cpu 0x%02x gpu 0x%02x\n",
               i, src[i], s[i / 32], q[i], hq[i]);
        break;
      }
  }
  assert_int_equal(dq_bad, 0);
  assert_int_equal(ds_bad, 0);
  free(q);
  free(s);
  free(hq);
  free(hs);
  CK(cudaFree(dsrc));
  CK(cudaFree(dq));
  CK(cudaFree(ds));
}

static void test_cuda_quantize_random(void **state) {
  (void)state;
  kt_seed("test_cuda_quantize_random");
  for (int iter = 0; iter < 10; iter++) {
    int64_t rows = kt_rand_range(1, 300), k = 32 * kt_rand_range(1, 80);
    uint16_t *src = malloc((size_t)(rows * k) * 2);
    for (int64_t i = 0; i < rows * k; i++)
      src[i] = kt_rand_bf16();
    quantize_compare(src, rows, k, 0);
    quantize_compare(src, rows, k, 1 + iter % 7); /* unaligned path */
    free(src);
  }
}

/* Every BF16 under every reachable scale, plus adversarial blocks. */
static void test_cuda_quantize_exhaustive(void **state) {
  (void)state;
  int64_t cap = 1 << 24, n = 0;
  uint16_t *src = malloc((size_t)cap * 2);
  for (int E = 1; E <= 254; E++) {
    int32_t amax = -1;
    for (uint32_t b = 0; b <= 0x7f80; b++)
      if (refit_mxfp8_scale_exponent(refit_bf16_to_float((uint16_t)b)) == E)
        amax = (int32_t)b;
    if (amax < 0)
      continue;
    for (int32_t x = 0; x <= 2 * amax + 1; x++) {
      if (n % 32 == 0)
        src[n++] = (uint16_t)amax;
      src[n++] = (uint16_t)((x >> 1) | ((x & 1) << 15));
    }
    while (n % 32 != 0)
      src[n++] = (uint16_t)amax;
  }
  /* adversarial: NaN mixes, Inf mixes, zeros, -0, subnormals, 448/464 edges */
  const uint16_t special[] = {0x7fc0, 0xffc1, 0x7f80, 0xff80, 0x0000, 0x8000,
                              0x0001, 0x807f, 0x43e0, 0x43e8, 0x7f7f, 0x3a80};
  for (int b = 0; b < 4096; b++)
    for (int i = 0; i < 32; i++)
      src[n++] = (kt_rand() & 3) ? special[kt_rand() % 12] : kt_rand_bf16();
  int64_t k = 2048;
  while (n % k != 0)
    src[n++] = 0x3f80;
  quantize_compare(src, n / k, k, 0);
  free(src);
}

static void test_cuda_swizzle_and_dense(void **state) {
  (void)state;
  kt_seed("test_cuda_swizzle_and_dense");
  for (int iter = 0; iter < 24; iter++) {
    refit_kernels_dense_backend_t b = (refit_kernels_dense_backend_t)(iter % 3);
    int64_t n = kt_rand_range(1, 700);
    int64_t k = b == REFIT_KERNELS_DENSE_FLASHINFER_TRTLLM ? 256 * kt_rand_range(1, 8)
                                                          : 32 * kt_rand_range(1, 40);
    int64_t wb, sb;
    assert_int_equal(refit_kernels_dense_sizes(b, n, k, &wb, &sb), REFIT_OK);
    uint8_t *q = malloc((size_t)(n * k)), *s = malloc((size_t)(n * k / 32));
    kt_fill_bytes(q, (size_t)(n * k));
    kt_fill_bytes(s, (size_t)(n * k / 32));
    uint8_t *w = malloc((size_t)wb), *sw = malloc((size_t)sb);
    assert_int_equal(refit_kernels_dense_transform(b, n, k, q, s, w, sw), REFIT_OK);
    uint8_t *dq = dev_from(q, (size_t)(n * k)), *ds = dev_from(s, (size_t)(n * k / 32));
    uint8_t *dw = dev_from(NULL, (size_t)wb), *dsw = dev_from(NULL, (size_t)sb);
    CK(cudaMemset(dw, 0xEE, (size_t)wb));
    CK(cudaMemset(dsw, 0xEE, (size_t)sb));
    assert_int_equal(refit_kernels_dense_transform_cuda(b, n, k, dq, ds, dw, dsw, 0),
                     REFIT_OK);
    uint8_t *hw = host_from(dw, (size_t)wb), *hsw = host_from(dsw, (size_t)sb);
    assert_int_equal(count_diff(w, hw, (size_t)wb), 0);
    assert_int_equal(count_diff(sw, hsw, (size_t)sb), 0);
    /* plain swizzle of a stack of 3, input and output bases shifted (32-bit
     * or byte loads; 16-byte, 4-byte or byte stores) */
    const int in_shift[] = {0, 1, 4, 8}, out_shift[] = {0, 4, 1};
    const int si = in_shift[iter % 4], so = out_shift[iter % 3];
    int64_t num = 3, rows = kt_rand_range(1, 300), cols = kt_rand_range(1, 30);
    int64_t zb = refit_kernels_swizzle_bytes(rows, cols);
    uint8_t *lin = malloc((size_t)(num * rows * cols)), *z = malloc((size_t)(num * zb));
    kt_fill_bytes(lin, (size_t)(num * rows * cols));
    assert_int_equal(refit_kernels_scale_swizzle(lin, num, rows, cols, z), REFIT_OK);
    uint8_t *dl = dev_from(NULL, (size_t)(num * rows * cols)),
            *dz = dev_from(NULL, (size_t)(num * zb));
    CK(cudaMemcpy(dl + si, lin, (size_t)(num * rows * cols), cudaMemcpyHostToDevice));
    assert_int_equal(
        refit_kernels_scale_swizzle_cuda(dl + si, num, rows, cols, dz + so, 0), REFIT_OK);
    uint8_t *hz = host_from(dz, (size_t)(num * zb) + (size_t)so);
    assert_int_equal(count_diff(z, hz + so, (size_t)(num * zb)), 0);
    free(q); free(s); free(w); free(sw); free(hw); free(hsw); free(lin); free(z); free(hz);
    CK(cudaFree(dq)); CK(cudaFree(ds)); CK(cudaFree(dw)); CK(cudaFree(dsw));
    CK(cudaFree(dl)); CK(cudaFree(dz));
  }
}

/*
 * One MoE layer on the device against the C layout, every device base shifted
 * by `shift` bytes (0: 16-byte units and stores; 8, 4, 2, 1: the narrower
 * units, 4-byte scale words or bytes, 4-byte or byte stores): the batched
 * kernels, then the step-by-step GPU oracle.
 */
static void moe_compare(const refit_kernels_moe_shape_t *s, int shift) {
  refit_kernels_moe_sizes_t z;
  assert_int_equal(refit_kernels_moe_check_shape(s, "test", &z), REFIT_OK);
  int64_t in_sz[4] = {z.w13_weight, z.w13_weight / 32, z.w2_weight, z.w2_weight / 32};
  int64_t out_sz[4] = {z.w13_weight, z.w13_weight_scale, z.w2_weight, z.w2_weight_scale};
  uint8_t *in[4], *ref[4], *din[4], *dout[4];
  for (int i = 0; i < 4; i++) {
    in[i] = malloc((size_t)in_sz[i]);
    kt_fill_bytes(in[i], (size_t)in_sz[i]);
    ref[i] = malloc((size_t)out_sz[i]);
    din[i] = dev_from(NULL, (size_t)in_sz[i]);
    CK(cudaMemcpy(din[i] + shift, in[i], (size_t)in_sz[i], cudaMemcpyHostToDevice));
    dout[i] = dev_from(NULL, (size_t)out_sz[i]);
  }
  assert_int_equal(refit_kernels_moe_transform(s, in[0], in[1], in[2], in[3], ref[0],
                                               ref[1], ref[2], ref[3]),
                   REFIT_OK);
  int64_t scratch_bytes = refit_kernels_moe_oracle_scratch_bytes(s);
  uint8_t *scratch = dev_from(NULL, (size_t)scratch_bytes);
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < 4; i++)
      CK(cudaMemset(dout[i], 0xEE, (size_t)out_sz[i] + 64));
    uint8_t *o[4] = {dout[0] + shift, dout[1] + shift, dout[2] + shift, dout[3] + shift};
    if (pass == 0)
      assert_int_equal(refit_kernels_moe_transform_cuda(s, din[0] + shift, din[1] + shift,
                                                        din[2] + shift, din[3] + shift,
                                                        o[0], o[1], o[2], o[3], 0),
                       REFIT_OK);
    else
      assert_int_equal(refit_kernels_moe_transform_oracle_cuda(
                           s, din[0] + shift, din[1] + shift, din[2] + shift,
                           din[3] + shift, o[0], o[1], o[2], o[3], scratch, scratch_bytes,
                           0),
                       REFIT_OK);
    for (int i = 0; i < 4; i++) {
      /* the bytes around the output stay as poisoned */
      uint8_t *h = host_from(dout[i], (size_t)out_sz[i] + 64);
      int64_t bad = count_diff(ref[i], h + shift, (size_t)out_sz[i]);
      for (int64_t b = 0; b < out_sz[i] + 64; b++)
        bad += (b < shift || b >= shift + out_sz[i]) && h[b] != 0xEE;
      if (bad != 0)
        printf(
            "moe E=%lld H=%lld I=%lld gated=%d shift %d %s tensor %d: %lld bad bytes\n",
            (long long)s->num_experts, (long long)s->hidden, (long long)s->intermediate,
            s->gated, shift, pass == 0 ? "batched" : "oracle", i, (long long)bad);
      assert_int_equal(bad, 0);
      free(h);
    }
  }
  for (int i = 0; i < 4; i++) {
    free(in[i]);
    free(ref[i]);
    CK(cudaFree(din[i]));
    CK(cudaFree(dout[i]));
  }
  CK(cudaFree(scratch));
}

static void test_cuda_moe(void **state) {
  (void)state;
  kt_seed("test_cuda_moe");
  /* Row units of 16 bytes (w13 / w2): 16 / 12, 24 / 8, 128 / 48 (the
   * Qwen3-30B-A3B layer), 32 / 20, 40 / 20 and 8 / 4 with scale columns 20 / 10
   * and 4 / 2 (padded to Kp). */
  const refit_kernels_moe_shape_t shapes[] = {{3, 256, 192, 1},    {2, 384, 128, 0},
                                              {128, 2048, 768, 1}, {4, 512, 320, 1},
                                              {5, 640, 320, 1},    {2, 128, 64, 1}};
  const int shifts[] = {0, 8, 4, 2, 1};
  for (size_t t = 0; t < sizeof(shapes) / sizeof(shapes[0]); t++) {
    /* The large layer once, aligned; the small ones at every shift. */
    const size_t nshift =
        shapes[t].num_experts >= 128 ? 1 : sizeof(shifts) / sizeof(shifts[0]);
    for (size_t i = 0; i < nshift; i++)
      moe_compare(&shapes[t], shifts[i]);
  }
}

int main(void) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    printf("test_kernels_cuda: no CUDA device, skipped\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cuda_quantize_random),
      cmocka_unit_test(test_cuda_quantize_exhaustive),
      cmocka_unit_test(test_cuda_swizzle_and_dense),
      cmocka_unit_test(test_cuda_moe),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * The NVFP4 CUDA twin == the C reference, byte for byte: adversarial blocks
 * (zeros, subnormals, huge and tiny, +-Inf, NaN), partial blocks and odd K,
 * several global scales (the tensor's own, 1, +Inf, tiny), strided and
 * unaligned buffers; and the NVFP4 MoE expert layouts of both FlashInfer
 * backends equal to the C ones. Exits 77 (skipped) without a GPU.
 */
#include "kernels/layout.h"
#include "kernels/mxfp8_cuda.h"
#include "kernels/nvfp4_cuda.h"
#include "kernels/nvfp4_rules.h" /* refit_nvfp4_amax_tile_rows */
#include "nvfp4_scenario.h"

#include <cuda_runtime_api.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
/* cmocka.h needs the headers above first. */
#include <cmocka.h>

#define CK(call) assert_int_equal((int)(call), (int)cudaSuccess)

/* rows x k from a source of row stride sk, src shifted by `shift` elements
 * and q and sf by `shift` bytes on the device (0: aligned); gsf 0 means the
 * matrix's own global scale. */
static void compare(int64_t rows, int64_t k, int64_t sk, int shift, float gsf) {
  const int64_t qb = refit_nvfp4_row_bytes(k), nb = refit_nvfp4_scale_cols(k);
  const size_t n = (size_t)(rows * sk), nq = (size_t)(rows * qb),
               ns = (size_t)(rows * nb);
  uint16_t *x = malloc(n * 2);
  uint8_t *q = malloc(nq), *hq = malloc(nq), *s = malloc(ns), *hs = malloc(ns);
  nvs_fill(x, rows, sk);
  if (gsf == 0.0f)
    gsf = refit_nvfp4_global_scale(refit_nvfp4_amax_key(x, rows, k, sk, NULL));
  assert_int_equal(refit_nvfp4_quantize(x, rows, k, sk, gsf, q, qb, s, nb), REFIT_OK);
  uint16_t *dx = NULL;
  uint8_t *dq = NULL, *ds = NULL;
  CK(cudaMalloc((void **)&dx, (n + 8) * 2));
  CK(cudaMalloc((void **)&dq, nq + 8));
  CK(cudaMalloc((void **)&ds, ns + 8));
  CK(cudaMemcpy(dx + shift, x, n * 2, cudaMemcpyHostToDevice));
  assert_int_equal(refit_nvfp4_quantize_cuda(dx + shift, rows, k, sk, gsf, dq + shift, qb,
                                             ds + shift, nb, 0),
                   REFIT_OK);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(hq, dq + shift, nq, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hs, ds + shift, ns, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < nq; i++)
    if (q[i] != hq[i]) {
      printf("[%lld, %lld] gsf %g shift %d: first value diff at byte (%lld, %lld): "
             "cpu 0x%02x gpu 0x%02x\n",
             (long long)rows, (long long)k, (double)gsf, shift,
             (long long)(i / (size_t)qb), (long long)(i % (size_t)qb), q[i], hq[i]);
      fail();
    }
  for (size_t i = 0; i < ns; i++)
    if (s[i] != hs[i]) {
      printf("[%lld, %lld] gsf %g shift %d: first scale diff at (%lld, %lld): "
             "cpu 0x%02x gpu 0x%02x\n",
             (long long)rows, (long long)k, (double)gsf, shift,
             (long long)(i / (size_t)nb), (long long)(i % (size_t)nb), s[i], hs[i]);
      fail();
    }
  CK(cudaFree(dx));
  CK(cudaFree(dq));
  CK(cudaFree(ds));
  free(x);
  free(q);
  free(hq);
  free(s);
  free(hs);
}

static void test_cuda_nvfp4(void **state) {
  (void)state;
  static const int64_t shapes[][3] = {
      {128, 128, 128}, {1280, 1152, 1152}, {200, 130, 130},  {130, 257, 300},
      {1, 1, 1},       {7, 33, 40},        {300, 8400, 8400}};
  const float scales[] = {0.0f, 1.0f, __builtin_inff(), 1e-30f};
  for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
    for (size_t g = 0; g < sizeof(scales) / sizeof(scales[0]); g++)
      for (int shift = 0; shift < 2; shift++)
        compare(shapes[i][0], shapes[i][1], shapes[i][2], shift, scales[g]);
}

/* Every BF16 value as an element, and as a block's amax, under gsf 1 and the
 * global scales of amax 1 and 1e30: rows of 16 hold consecutive patterns. */
static void test_cuda_nvfp4_every_bf16(void **state) {
  (void)state;
  const int64_t rows = 4096, k = 16;
  uint16_t *x = malloc((size_t)(rows * k) * 2);
  uint8_t *q = malloc((size_t)(rows * 8)), *hq = malloc((size_t)(rows * 8));
  uint8_t *s = malloc((size_t)rows), *hs = malloc((size_t)rows);
  for (int64_t i = 0; i < rows * k; i++)
    x[i] = (uint16_t)i;
  const float scales[] = {1.0f, refit_nvfp4_global_scale(0x3f80),
                          refit_nvfp4_global_scale(0x7149)};
  uint16_t *dx = NULL;
  uint8_t *dq = NULL, *ds = NULL;
  CK(cudaMalloc((void **)&dx, (size_t)(rows * k) * 2));
  CK(cudaMalloc((void **)&dq, (size_t)(rows * 8)));
  CK(cudaMalloc((void **)&ds, (size_t)rows));
  CK(cudaMemcpy(dx, x, (size_t)(rows * k) * 2, cudaMemcpyHostToDevice));
  for (size_t g = 0; g < sizeof(scales) / sizeof(scales[0]); g++) {
    assert_int_equal(refit_nvfp4_quantize(x, rows, k, k, scales[g], q, 8, s, 1),
                     REFIT_OK);
    assert_int_equal(
        refit_nvfp4_quantize_cuda(dx, rows, k, k, scales[g], dq, 8, ds, 1, 0), REFIT_OK);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hq, dq, (size_t)(rows * 8), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hs, ds, (size_t)rows, cudaMemcpyDeviceToHost));
    assert_memory_equal(q, hq, (size_t)(rows * 8));
    assert_memory_equal(s, hs, (size_t)rows);
  }
  CK(cudaFree(dx));
  CK(cudaFree(dq));
  CK(cudaFree(ds));
  free(x);
  free(q);
  free(hq);
  free(s);
  free(hs);
}

/* refit_nvfp4_amax_key_cuda == the C key: adversarial matrices (NaN, +-Inf,
 * subnormals) of aligned and unaligned shapes, strides and starts, merged
 * into a slot that already holds a smaller and a larger key. */
static void test_cuda_nvfp4_amax(void **state) {
  (void)state;
  const int64_t shapes[][3] = {{1, 1, 1},     {3, 17, 17},   {64, 256, 256},
                               {5, 40, 48},   {7, 33, 40},   {128, 1024, 1032},
                               {2, 4096, 4096}, {300, 64, 72}};
  for (size_t t = 0; t < sizeof(shapes) / sizeof(shapes[0]); t++)
    for (int shift = 0; shift < 2; shift++) {
      const int64_t rows = shapes[t][0], k = shapes[t][1], sk = shapes[t][2];
      const size_t n = (size_t)(rows * sk);
      uint16_t *x = malloc(n * 2);
      nvs_fill(x, rows, sk);
      const uint16_t want = refit_nvfp4_amax_key(x, rows, k, sk, NULL);
      uint16_t *dx = NULL;
      uint32_t *dkey = NULL;
      CK(cudaMalloc((void **)&dx, (n + 8) * 2));
      CK(cudaMalloc((void **)&dkey, 2 * sizeof(uint32_t)));
      CK(cudaMemcpy(dx + shift, x, n * 2, cudaMemcpyHostToDevice));
      const uint32_t init[2] = {0, 0x7f80u};
      for (int i = 0; i < 2; i++) {
        CK(cudaMemcpy(dkey, &init[i], sizeof(uint32_t), cudaMemcpyHostToDevice));
        assert_int_equal(refit_nvfp4_amax_key_cuda(dx + shift, rows, k, sk, dkey, 0),
                         REFIT_OK);
        uint32_t got = 0;
        CK(cudaMemcpy(&got, dkey, sizeof(got), cudaMemcpyDeviceToHost));
        const uint32_t expect = want > init[i] ? want : init[i];
        if (got != expect)
          fail_msg("amax [%lld, %lld] stride %lld shift %d from %#x: got %#x, C %#x",
                   (long long)rows, (long long)k, (long long)sk, shift, init[i], got,
                   expect);
      }
      CK(cudaFree(dx));
      CK(cudaFree(dkey));
      free(x);
    }
  assert_int_equal(refit_nvfp4_amax_key_cuda(NULL, 2, 2, 2, NULL, 0),
                   REFIT_ERR_INVALID_ARGUMENT);
}

/* refit_nvfp4_quantize_groups_cuda == refit_nvfp4_quantize_groups: 300
 * stacked matrices (two launches) of a partial block and a row stride,
 * aligned and shifted, under their own scales (+Inf among them), and their
 * decode scales. */
static void test_cuda_nvfp4_groups(void **state) {
  (void)state;
  enum { G = 300, ROWS = 3, K = 40, SK = 48, QB = 20, NB = 3 };
  const size_t n = (size_t)G * ROWS * SK, nq = (size_t)G * ROWS * QB,
               ns = (size_t)G * ROWS * NB;
  uint16_t *x = malloc(n * 2);
  uint8_t *q = malloc(nq), *hq = malloc(nq), *s = malloc(ns), *hs = malloc(ns);
  float gsf[G], decode[G], hdecode[G];
  nvs_fill(x, G * ROWS, SK);
  for (int g = 0; g < G; g++)
    gsf[g] = g % 7 == 3 ? __builtin_inff()
                        : refit_nvfp4_global_scale(
                              refit_nvfp4_amax_key(x + g * ROWS * SK, ROWS, K, SK, NULL));
  assert_int_equal(
      refit_nvfp4_quantize_groups(x, G, ROWS, K, SK, gsf, q, QB, s, NB, decode),
      REFIT_OK);
  uint16_t *dx = NULL;
  uint8_t *dq = NULL, *ds = NULL;
  float *dd = NULL;
  CK(cudaMalloc((void **)&dx, (n + 8) * 2));
  CK(cudaMalloc((void **)&dq, nq + 8));
  CK(cudaMalloc((void **)&ds, ns + 8));
  CK(cudaMalloc((void **)&dd, sizeof(decode)));
  for (int shift = 0; shift < 2; shift++) {
    CK(cudaMemcpy(dx + shift, x, n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(dd, 0, sizeof(decode)));
    assert_int_equal(refit_nvfp4_quantize_groups_cuda(dx + shift, G, ROWS, K, SK, gsf,
                                                      dq + shift, QB, ds + shift, NB, dd,
                                                      0),
                     REFIT_OK);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hq, dq + shift, nq, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hs, ds + shift, ns, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hdecode, dd, sizeof(hdecode), cudaMemcpyDeviceToHost));
    assert_memory_equal(q, hq, nq);
    assert_memory_equal(s, hs, ns);
    assert_memory_equal(decode, hdecode, sizeof(decode));
  }
  CK(cudaFree(dx));
  CK(cudaFree(dq));
  CK(cudaFree(ds));
  CK(cudaFree(dd));
  free(x);
  free(q);
  free(hq);
  free(s);
  free(hs);
}

/* refit_nvfp4_amax_keys_cuda == refit_nvfp4_amax_keys: one table of
 * adversarial matrices of aligned and unaligned shapes, strides and starts,
 * an empty one, one wider than a tile and one of many tiles, the last two
 * sharing a slot with others, merged into slots that hold keys already. */
static void test_cuda_nvfp4_amax_table(void **state) {
  (void)state;
  const int64_t shapes[][3] = {{1, 1, 1},         {3, 17, 17},       {64, 256, 256},
                               {5, 40, 48},       {7, 33, 40},       {0, 16, 16},
                               {3, 40000, 40008}, {900, 1024, 1032}, {300, 64, 72}};
  enum { N = sizeof(shapes) / sizeof(shapes[0]), SLOTS = N - 2 };
  size_t at[N], total = 0;
  for (int i = 0; i < N; i++) {
    at[i] = total + (size_t)(i % 2); /* odd descriptors start one element off */
    total = at[i] + (size_t)(shapes[i][0] * shapes[i][2]) + 8;
  }
  uint16_t *x = malloc(total * 2), *dx = NULL;
  for (int i = 0; i < N; i++)
    nvs_fill(x + at[i], shapes[i][0], shapes[i][2]);
  uint32_t *dslots = NULL, want[SLOTS], got[SLOTS];
  CK(cudaMalloc((void **)&dx, total * 2));
  CK(cudaMalloc((void **)&dslots, sizeof(want)));
  CK(cudaMemcpy(dx, x, total * 2, cudaMemcpyHostToDevice));
  refit_nvfp4_amax_desc_t host[N], dev[N];
  for (int i = 0; i < N; i++) {
    const int slot = i < SLOTS ? i : i - SLOTS; /* the last two share 0 and 1 */
    host[i] = (refit_nvfp4_amax_desc_t){x + at[i],    shapes[i][0], shapes[i][1],
                                        shapes[i][2], &want[slot],  0};
    dev[i] = host[i];
    dev[i].src = dx + at[i];
    dev[i].slot = dslots + slot;
  }
  for (int i = 0; i < SLOTS; i++)
    want[i] = i % 3 == 0 ? 0x7f80u : (uint32_t)i;
  CK(cudaMemcpy(dslots, want, sizeof(want), cudaMemcpyHostToDevice));
  assert_int_equal(refit_nvfp4_amax_keys(host, N), REFIT_OK);
  refit_status_t st = REFIT_ERR_INTERNAL;
  const int64_t tiles = refit_nvfp4_amax_number(dev, N, &st);
  assert_int_equal(st, REFIT_OK);
  assert_true(tiles > 900 / refit_nvfp4_amax_tile_rows(1024));
  refit_nvfp4_amax_desc_t *ddesc = NULL;
  CK(cudaMalloc((void **)&ddesc, sizeof(dev)));
  CK(cudaMemcpy(ddesc, dev, sizeof(dev), cudaMemcpyHostToDevice));
  assert_int_equal(refit_nvfp4_amax_keys_cuda(ddesc, N, tiles, 0), REFIT_OK);
  CK(cudaMemcpy(got, dslots, sizeof(got), cudaMemcpyDeviceToHost));
  for (int i = 0; i < SLOTS; i++)
    if (got[i] != want[i])
      fail_msg("amax table slot %d: got %#x, C %#x", i, got[i], want[i]);
  dev[1].stride = 3; /* below K */
  assert_int_equal(refit_nvfp4_amax_number(dev, N, &st), -1);
  assert_int_equal(st, REFIT_ERR_INVALID_ARGUMENT);
  CK(cudaFree(ddesc));
  CK(cudaFree(dx));
  CK(cudaFree(dslots));
  free(x);
}

/* refit_kernels_nvfp4_moe_transform_cuda == the C layout, every backend and
 * tensor, on random bytes with a K whose scale columns pad (H 336: 21). */
static void test_cuda_nvfp4_moe_layout(void **state) {
  (void)state;
  const refit_kernels_moe_shape_t s = {3, 336, 64, 1}, t = {3, 512, 64, 1};
  for (int b = 0; b <= 1; b++) {
    const refit_kernels_moe_shape_t *sh = b == 0 ? &t : &s; /* TRTLLM needs H % 256 */
    for (int w13 = 0; w13 <= 1; w13++) {
      const int64_t m = w13 ? 2 * sh->intermediate : sh->hidden;
      const int64_t k = w13 ? sh->hidden : sh->intermediate;
      const size_t nw = (size_t)(sh->num_experts * m * (k / 2));
      const size_t nl = (size_t)(sh->num_experts * m * (k / 16));
      const size_t ns =
          (size_t)(sh->num_experts * ((m + 127) / 128 * 128) * ((k / 16 + 3) / 4 * 4));
      uint8_t *hw = malloc(nw), *hl = malloc(nl), *cw = malloc(nw), *cs = malloc(ns);
      uint8_t *gw = malloc(nw), *gs = malloc(ns), *dw, *dl, *dwo, *dso;
      assert_true(hw && hl && cw && cs && gw && gs);
      for (size_t i = 0; i < nw; i++)
        hw[i] = (uint8_t)rand();
      for (size_t i = 0; i < nl; i++)
        hl[i] = (uint8_t)rand();
      const refit_kernels_moe_tensor_t which =
          w13 ? REFIT_KERNELS_MOE_W13 : REFIT_KERNELS_MOE_W2;
      assert_int_equal(refit_kernels_nvfp4_moe_transform((refit_kernels_moe_backend_t)b,
                                                         sh, which, hw, hl, cw, cs),
                       REFIT_OK);
      CK(cudaMalloc((void **)&dw, nw));
      CK(cudaMalloc((void **)&dl, nl));
      CK(cudaMalloc((void **)&dwo, nw));
      CK(cudaMalloc((void **)&dso, ns));
      CK(cudaMemcpy(dw, hw, nw, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dl, hl, nl, cudaMemcpyHostToDevice));
      assert_int_equal(
          refit_kernels_nvfp4_moe_transform_cuda((refit_kernels_moe_backend_t)b, sh,
                                                 which, dw, dl, dwo, dso, 0),
          REFIT_OK);
      CK(cudaMemcpy(gw, dwo, nw, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(gs, dso, ns, cudaMemcpyDeviceToHost));
      assert_memory_equal(gw, cw, nw);
      assert_memory_equal(gs, cs, ns);
      CK(cudaFree(dw));
      CK(cudaFree(dl));
      CK(cudaFree(dwo));
      CK(cudaFree(dso));
      free(hw);
      free(hl);
      free(cw);
      free(cs);
      free(gw);
      free(gs);
    }
  }
}

int main(void) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    printf("test_kernels_nvfp4_cuda: no CUDA device, skipped\n");
    return 77;
  }
  kt_seed("test_kernels_nvfp4_cuda");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cuda_nvfp4),
      cmocka_unit_test(test_cuda_nvfp4_every_bf16),
      cmocka_unit_test(test_cuda_nvfp4_amax),
      cmocka_unit_test(test_cuda_nvfp4_amax_table),
      cmocka_unit_test(test_cuda_nvfp4_groups),
      cmocka_unit_test(test_cuda_nvfp4_moe_layout),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

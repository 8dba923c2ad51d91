/*
 * Data-path CUDA twins == host references, byte for byte: random descriptor
 * tables (misaligned offsets everywhere, odd row_bytes, rows = 1 and 0,
 * chunks over the 8 KiB tile, up to 700 descriptors so the kernels' 256-entry
 * batches roll over, digests off, on and mixed; and 8/16-byte aligned tables,
 * where digests are summed while landing), corrupted chunks (reported as the
 * smallest bad index; every chunk lands, the bad ones the same bytes as on
 * the host, the others as without the corruption), synthetic values and the
 * compare kernel. Exits 77 (skipped) without a GPU.
 */
#include "datapath_scenario.h"
#include "kernels/datapath_cuda.h"
#include "kernels/synth_rules.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */

#define CK(call) assert_int_equal((int)(call), (int)cudaSuccess)

static void *dev_copy(const void *host, size_t n) {
  void *d = NULL;
  CK(cudaMalloc(&d, n + 16));
  if (host != NULL)
    CK(cudaMemcpy(d, host, n, cudaMemcpyHostToDevice));
  return d;
}

static void expect_same(const uint8_t *want, const void *dev, size_t n,
                        const char *what) {
  uint8_t *got = malloc(n);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(got, dev, n, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i]) {
      printf(
          "%s: first difference at byte %zu of %zu: host 0x%02x, gpu 0x%02x\n",
          what, i, n, want[i], got[i]);
      break;
    }
  assert_memory_equal(got, want, n);
  free(got);
}

/*
 * One scenario on both sides (`aligned`: dps_create_aligned). corrupt >= 0:
 * after packing, flip a bit in the wire rows of the first chunks with digests
 * and data at or after `corrupt`, and of one chunk further on, so the
 * smallest index must win.
 */
static void twin(int64_t n, int digest_mode, int corrupt, int aligned) {
  dps_t s;
  dps_create_aligned(&s, n, digest_mode, aligned);
  refit_pack_desc_t *hp = malloc((size_t)n * sizeof(*hp)),
                    *dp = malloc((size_t)n * sizeof(*dp));
  refit_land_desc_t *hl = malloc((size_t)n * sizeof(*hl)),
                    *dl = malloc((size_t)n * sizeof(*dl));
  uint8_t *hwire = malloc((size_t)s.wire_bytes),
          *hdst = malloc((size_t)s.dst_bytes);
  memset(hwire, 0xA5, (size_t)s.wire_bytes);
  memset(hdst, 0x5A, (size_t)s.dst_bytes);
  uint8_t *dsrc = dev_copy(s.src, (size_t)s.src_bytes);
  uint8_t *dwire = dev_copy(hwire, (size_t)s.wire_bytes);
  uint8_t *ddst = dev_copy(hdst, (size_t)s.dst_bytes);
  dps_bind(&s, s.src, hdst, hp, hl);
  dps_bind(&s, dsrc, ddst, dp, dl);
  refit_pack_desc_t *dpd = dev_copy(dp, (size_t)n * sizeof(*dp));
  refit_land_desc_t *dld = dev_copy(dl, (size_t)n * sizeof(*dl));

  assert_int_equal(refit_pack_rows(hp, n, dps_tag, hwire), REFIT_OK);
  assert_int_equal(refit_pack_rows_cuda(dpd, n, dps_tag, dwire, 0), REFIT_OK);
  expect_same(hwire, dwire, (size_t)s.wire_bytes, "pack wire");

  int64_t flipped[2] = {-1, -1};
  uint8_t *clean = NULL; /* the host landing of the intact wire */
  if (corrupt >= 0) {
    int64_t none = 0;
    clean = malloc((size_t)s.dst_bytes);
    memcpy(clean, hdst, (size_t)s.dst_bytes);
    dps_bind(&s, s.src, clean, hp, hl);
    assert_int_equal(refit_land_rows(hl, n, dps_tag, hwire, &none), REFIT_OK);
    assert_int_equal(none, -1);
    dps_bind(&s, s.src, hdst, hp, hl);
    int k = 0;
    for (int64_t i = corrupt; i < n && k < 2; i++)
      if (hp[i].digest && hp[i].rows * hp[i].row_bytes > 0 &&
          (k == 0 || i > flipped[0] + 3)) {
        const int64_t at = hp[i].dst_offset +
                           kt_rand_range(0, hp[i].rows * hp[i].row_bytes - 1);
        hwire[at] ^= (uint8_t)(1u << kt_rand_range(0, 7));
        flipped[k++] = i;
      }
    CK(cudaMemcpy(dwire, hwire, (size_t)s.wire_bytes, cudaMemcpyHostToDevice));
  }
  int64_t hbad = 0, dbad = -1, *dbad_dev = dev_copy(&dbad, sizeof(dbad));
  assert_int_equal(refit_land_rows(hl, n, dps_tag, hwire, &hbad), REFIT_OK);
  assert_int_equal(refit_land_rows_cuda(dld, n, dps_tag, dwire, dbad_dev, 0), REFIT_OK);
  expect_same(hdst, ddst, (size_t)s.dst_bytes, "land dst");
  CK(cudaMemcpy(&dbad, dbad_dev, sizeof(dbad), cudaMemcpyDeviceToHost));
  assert_int_equal(hbad, flipped[0]);
  assert_int_equal(dbad, hbad);
  if (clean != NULL) /* (the bad chunks' bytes: equal to the host's above) */
    for (int64_t i = 0; i < n; i++)
      if (i != flipped[0] && i != flipped[1])
        assert_true(dps_chunk_same(&s, hl, i, hdst, hdst, clean));
  free(clean);
  /* Intact rows checked as another refit's: the seal fails on the device at
   * the same chunk as on the host (the first with a digest). */
  if (corrupt < 0) {
    int64_t other_bad = 0;
    dbad = -1;
    CK(cudaMemcpy(dbad_dev, &dbad, sizeof(dbad), cudaMemcpyHostToDevice));
    assert_int_equal(refit_land_rows(hl, n, dps_tag ^ 4, hwire, &other_bad), REFIT_OK);
    assert_int_equal(refit_land_rows_cuda(dld, n, dps_tag ^ 4, dwire, dbad_dev, 0), REFIT_OK);
    CK(cudaMemcpy(&dbad, dbad_dev, sizeof(dbad), cudaMemcpyDeviceToHost));
    assert_int_equal(dbad, other_bad);
  }

  CK(cudaFree(dsrc));
  CK(cudaFree(dwire));
  CK(cudaFree(ddst));
  CK(cudaFree(dpd));
  CK(cudaFree(dld));
  CK(cudaFree(dbad_dev));
  free(hp);
  free(dp);
  free(hl);
  free(dl);
  free(hwire);
  free(hdst);
  dps_destroy(&s);
}

static void test_cuda_datapath_twins(void **state) {
  (void)state;
  kt_seed("test_cuda_datapath_twins");
  for (int iter = 0; iter < 24; iter++)
    twin(kt_rand_range(1, 40), iter % 3, -1, iter % 2);
  twin(1, 0, -1, 0);
  twin(700, 2, -1, 0);
  twin(700, 1, -1, 0);
  twin(700, 1, -1, 1);
}

static void test_cuda_datapath_corrupt(void **state) {
  (void)state;
  kt_seed("test_cuda_datapath_corrupt");
  for (int iter = 0; iter < 16; iter++)
    twin(kt_rand_range(4, 60), 1 + iter % 2, (int)kt_rand_range(0, 3),
         (iter / 2) % 2);
  twin(600, 1, 300, 0); /* past the first 256-descriptor batch */
  twin(600, 1, 300, 1);
}

/* Large aligned chunks: the fused pack digest and the 16-byte paths. */
static void test_cuda_datapath_large(void **state) {
  (void)state;
  kt_seed("test_cuda_datapath_large");
  const int64_t n = 5, bytes = 3 << 20;
  uint8_t *src = malloc((size_t)(n * bytes));
  kt_fill_bytes(src, (size_t)(n * bytes));
  uint8_t *dsrc = dev_copy(src, (size_t)(n * bytes));
  const int64_t wire_bytes = n * (bytes + 16);
  uint8_t *hwire = calloc((size_t)wire_bytes, 1),
          *dwire = dev_copy(hwire, (size_t)wire_bytes);
  refit_pack_desc_t hp[5], dp[5];
  for (int64_t i = 0; i < n; i++) {
    /* i = 3: 1536 pitched rows of 2 KiB (of 2 KiB + 16 B); others contiguous.
     */
    const int64_t rows = i == 3 ? 1024 : 1, rb = i == 3 ? 2048 : bytes - 16 * i;
    hp[i] = (refit_pack_desc_t){.src = src + i * bytes,
                                .src_pitch = i == 3 ? 2064 : rb,
                                .dst_offset = i * (bytes + 16),
                                .rows = rows,
                                .row_bytes = rb,
                                .op = REFIT_CHUNK_COPY,
                                .digest = 1};
    dp[i] = hp[i];
    dp[i].src = dsrc + i * bytes;
  }
  refit_pack_desc_t *dpd = dev_copy(dp, sizeof(dp));
  assert_int_equal(refit_pack_rows(hp, n, dps_tag, hwire), REFIT_OK);
  assert_int_equal(refit_pack_rows_cuda(dpd, n, dps_tag, dwire, 0), REFIT_OK);
  expect_same(hwire, dwire, (size_t)wire_bytes, "large pack wire");
  CK(cudaFree(dsrc));
  CK(cudaFree(dwire));
  CK(cudaFree(dpd));
  free(src);
  free(hwire);
}

static void test_cuda_synth_compare(void **state) {
  (void)state;
  kt_seed("test_cuda_synth_compare");
  for (int iter = 0; iter < 8; iter++) {
    const int64_t rows = kt_rand_range(1, 50), cols = kt_rand_range(1, 3000);
    const int64_t tc = cols + kt_rand_range(0, 100), r0 = kt_rand_range(0, 9),
                  c0 = tc - cols;
    /* Both modes: independent versions and updates of a master. */
    const refit_synth_key_t key = {
        .key = kt_rand(),
        .master = kt_rand(),
        .rate = iter % 4 < 2 ? 0.0f : (float)kt_rand_range(1, 100000) * 1e-7f,
        .norm = iter % 2};
    const size_t n = (size_t)(rows * cols);
    uint16_t *h = malloc(n * 2);
    refit_synth_rect(&key, tc, r0, c0, rows, cols, h);
    uint16_t *d = dev_copy(NULL, n * 2 + 2);
    const int shift = iter % 3 == 2; /* unaligned destination */
    assert_int_equal(refit_synth_rect_cuda(&key, tc, r0, c0, rows, cols, d + shift, 0),
                     REFIT_OK);
    expect_same((const uint8_t *)h, d + shift, n * 2, "synth rect");
    refit_synth_key_t *keys = malloc((size_t)rows * sizeof(*keys));
    int64_t *bases = malloc((size_t)rows * 8);
    for (int64_t r = 0; r < rows; r++) {
      keys[r] = (refit_synth_key_t){.key = kt_rand(),
                                    .master = kt_rand(),
                                    .rate = (float)kt_rand_range(0, 1) *
                                            (float)kt_rand_range(1, 100000) * 1e-7f,
                                    .norm = (int32_t)(kt_rand() & 1)};
      bases[r] = kt_rand_range(0, 1LL << 40);
    }
    refit_synth_rows(keys, bases, rows, cols, h);
    refit_synth_key_t *dk = dev_copy(keys, (size_t)rows * sizeof(*keys));
    int64_t *db = dev_copy(bases, (size_t)rows * 8);
    assert_int_equal(refit_synth_rows_cuda(dk, db, rows, cols, d, 0), REFIT_OK);
    expect_same((const uint8_t *)h, d, n * 2, "synth rows");
    /* compare: flip a few bytes of the device copy, every element size */
    uint8_t *hb = malloc(n * 2);
    memcpy(hb, h, n * 2);
    const int flips = (int)kt_rand_range(0, 5);
    for (int f = 0; f < flips; f++)
      hb[kt_rand_range(0, (int64_t)n * 2 - 1)] ^= 0x10;
    uint8_t *da = dev_copy(h, n * 2 + 1), *dbb = dev_copy(NULL, n * 2 + 1);
    CK(cudaMemcpy(dbb + shift, hb, n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(da + shift, h, n * 2, cudaMemcpyHostToDevice));
    for (size_t elem = 1; elem <= 4; elem *= 2) {
      if ((n * 2) % elem != 0)
        continue;
      int64_t hc, hf, dv[2] = {0, INT64_MAX}, *dd = dev_copy(dv, sizeof(dv));
      assert_int_equal(refit_compare(h, hb, n * 2, elem, &hc, &hf), REFIT_OK);
      assert_int_equal(refit_compare_cuda(da + shift, dbb + shift, n * 2, elem,
                                          dd, dd + 1, 0),
                       REFIT_OK);
      CK(cudaMemcpy(dv, dd, sizeof(dv), cudaMemcpyDeviceToHost));
      assert_int_equal(dv[0], hc);
      assert_int_equal(dv[1], hf);
      CK(cudaFree(dd));
    }
    free(h);
    free(keys);
    free(bases);
    free(hb);
    CK(cudaFree(d));
    CK(cudaFree(dk));
    CK(cudaFree(db));
    CK(cudaFree(da));
    CK(cudaFree(dbb));
  }
}

int main(void) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    printf("test_kernels_datapath_cuda: no CUDA device, skipped\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cuda_datapath_twins),
      cmocka_unit_test(test_cuda_datapath_corrupt),
      cmocka_unit_test(test_cuda_datapath_large),
      cmocka_unit_test(test_cuda_synth_compare),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

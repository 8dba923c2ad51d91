/*
 * The zero-copy data path's CUDA twin == its C reference, byte for byte:
 * the scenario of tests/kernels/direct_scenario.h (pitched, misaligned
 * trainer rows; MoE w13/w2, TRTLLM and CUTLASS dense layouts with padding; a
 * BF16 COPY whose words straddle rows) run on both sides: the trainer's
 * digests, the landed stores (and the oracle's), and the smallest bad chunk
 * when source bytes change after the digests; and the staged loader's
 * landing (QUANTIZE and SPLIT from a staging area, a flipped staged byte);
 * and block FP8 chunks quantized in place (BLOCK_QUANTIZE: the tile kernels'
 * digests, refit_direct_blocks_cuda's one launch for the values and scales).
 * Exits 77 (skipped) without a GPU.
 */
#include "direct_block_scenario.h"
#include "direct_scenario.h"
#include "kernels/direct_cuda.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */

#define CK(call) assert_int_equal((int)(call), (int)cudaSuccess)

static void *dev_copy(const void *host, size_t n) {
  void *d = NULL;
  CK(cudaMalloc(&d, n + 16));
  if (host != NULL)
    CK(cudaMemcpy(d, host, n, cudaMemcpyHostToDevice));
  return d;
}

static void *to_host(const void *dev, size_t n) {
  void *h = malloc(n);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(h, dev, n, cudaMemcpyDeviceToHost));
  return h;
}

/* Both sides of one scenario (aligned: the variant the device takes its wide
 * paths for); corrupt >= 0 changes source bytes of chunk `corrupt` and of
 * later ones after the trainer's digests. */
static void twin(int corrupt, int aligned) {
  dis_t s;
  dis_create_mode(&s, aligned);
  const size_t tb = sizeof(s.trainer), lb = sizeof(s.land);
  /* Host. */
  uint8_t *hsrc = malloc((size_t)s.src_bytes), *hdst = malloc((size_t)s.dst_bytes);
  uint8_t *hdig = calloc(1, (size_t)s.digest_bytes);
  memcpy(hsrc, s.src, (size_t)s.src_bytes);
  memcpy(hdst, s.init, (size_t)s.dst_bytes);
  refit_direct_desc_t *ht = malloc(tb), *hl = malloc(lb), *dt = malloc(tb), *dl = malloc(lb);
  memcpy(ht, s.trainer, tb);
  memcpy(hl, s.land, lb);
  memcpy(dt, s.trainer, tb);
  memcpy(dl, s.land, lb);
  dis_bind(ht, s.nchunks, hsrc, hdst);
  dis_bind(hl, s.n, hsrc, hdst);
  /* Device. */
  uint8_t *dsrc = dev_copy(s.src, (size_t)s.src_bytes), *ddst = dev_copy(s.init, (size_t)s.dst_bytes);
  uint8_t *ddig = dev_copy(NULL, (size_t)s.digest_bytes);
  dis_bind(dt, s.nchunks, dsrc, ddst);
  dis_bind(dl, s.n, dsrc, ddst);
  refit_direct_desc_t *dtd = dev_copy(dt, tb), *dld = dev_copy(dl, lb);
  unsigned long long *acc = dev_copy(NULL, (size_t)s.n * 8);
  int64_t *dbad = dev_copy(NULL, 8);
  const int64_t minus1 = -1;
  CK(cudaMemcpy(dbad, &minus1, 8, cudaMemcpyHostToDevice));

  assert_int_equal(refit_direct_rows(ht, s.nchunks, 99, hdig, NULL), REFIT_OK);
  assert_int_equal(refit_direct_rows_cuda(dtd, s.nchunks, 99, ddig, acc, NULL, 0), REFIT_OK);
  uint8_t *gdig = to_host(ddig, (size_t)s.digest_bytes);
  assert_memory_equal(gdig, hdig, (size_t)s.digest_bytes);
  if (corrupt >= 0)
    for (int64_t k = corrupt; k < s.nchunks; k += s.nchunks / 3 + 1) {
      const int64_t at = (int64_t)((uint8_t *)hl[k].src - hsrc) + (hl[k].rows / 2) * hl[k].src_pitch + 1;
      hsrc[at] ^= 0x08;
      CK(cudaMemcpy(dsrc + at, hsrc + at, 1, cudaMemcpyHostToDevice));
    }
  int64_t hbad = 5, gbad = 5;
  assert_int_equal(refit_direct_rows(hl, s.n, 99, hdig, &hbad), REFIT_OK);
  assert_int_equal(refit_direct_rows_cuda(dld, s.n, 99, ddig, acc, dbad, 0), REFIT_OK);
  uint8_t *gdst = to_host(ddst, (size_t)s.dst_bytes);
  CK(cudaMemcpy(&gbad, dbad, 8, cudaMemcpyDeviceToHost));
  for (int64_t i = 0; i < s.dst_bytes; i++)
    if (gdst[i] != hdst[i]) {
      printf("first difference at byte %lld of %lld: host 0x%02x, gpu 0x%02x\n", (long long)i,
             (long long)s.dst_bytes, hdst[i], gdst[i]);
      break;
    }
  assert_memory_equal(gdst, hdst, (size_t)s.dst_bytes);
  assert_int_equal(gbad, hbad);
  if (corrupt < 0) {
    assert_int_equal(gbad, -1);
    assert_memory_equal(gdst, s.want, (size_t)s.dst_bytes);
  } else {
    assert_int_equal(gbad, corrupt);
  }
  free(gdig);
  free(gdst);
  free(hsrc);
  free(hdst);
  free(hdig);
  free(ht);
  free(hl);
  free(dt);
  free(dl);
  CK(cudaFree(dsrc));
  CK(cudaFree(ddst));
  CK(cudaFree(ddig));
  CK(cudaFree(dtd));
  CK(cudaFree(dld));
  CK(cudaFree(acc));
  CK(cudaFree(dbad));
  dis_destroy(&s);
}

/* The staged loader's landing (dis_stage: wire chunks in a staging area at
 * any alignment, BF16 QUANTIZE or prequantized SPLIT) on both sides, with a
 * flipped staged byte when `flip`: the same stores, the same bad chunk. */
static void twin_staged(int split, int aligned, int flip) {
  dis_t s;
  dis_create_mode(&s, aligned);
  int64_t sbytes = 0;
  uint8_t *stage = dis_stage(&s, split, 5, &sbytes);
  const size_t lb = sizeof(s.land);
  const int64_t victim = s.nchunks / 3;
  if (flip)
    stage[s.land[victim].src_offset + s.land[victim].rows * s.land[victim].src_pitch / 2] ^= 4;
  uint8_t *hdst = malloc((size_t)s.dst_bytes);
  memcpy(hdst, s.init, (size_t)s.dst_bytes);
  refit_direct_desc_t *hl = malloc(lb), *dl = malloc(lb);
  memcpy(hl, s.land, lb);
  memcpy(dl, s.land, lb);
  uint8_t *dstage = dev_copy(stage, (size_t)sbytes), *ddst = dev_copy(s.init, (size_t)s.dst_bytes);
  dis_bind(hl, s.n, NULL, hdst);
  dis_bind(dl, s.n, NULL, ddst);
  refit_direct_desc_t *dld = dev_copy(dl, lb);
  unsigned long long *acc = dev_copy(NULL, (size_t)s.n * 8);
  int64_t *dbad = dev_copy(NULL, 8), hbad = 5, gbad = 5;
  const int64_t minus1 = -1;
  CK(cudaMemcpy(dbad, &minus1, 8, cudaMemcpyHostToDevice));
  assert_int_equal(refit_direct_rows(hl, s.n, 5, stage, &hbad), REFIT_OK);
  assert_int_equal(refit_direct_rows_cuda(dld, s.n, 5, dstage, acc, dbad, 0), REFIT_OK);
  uint8_t *gdst = to_host(ddst, (size_t)s.dst_bytes);
  CK(cudaMemcpy(&gbad, dbad, 8, cudaMemcpyDeviceToHost));
  for (int64_t i = 0; i < s.dst_bytes; i++)
    if (gdst[i] != hdst[i]) {
      printf("staged (split %d): first difference at byte %lld of %lld: host 0x%02x, gpu "
             "0x%02x\n",
             split, (long long)i, (long long)s.dst_bytes, hdst[i], gdst[i]);
      break;
    }
  assert_memory_equal(gdst, hdst, (size_t)s.dst_bytes);
  assert_int_equal(gbad, hbad);
  assert_int_equal(gbad, flip ? victim : -1);
  if (!flip)
    assert_memory_equal(gdst, s.want, (size_t)s.dst_bytes);
  free(gdst);
  free(hdst);
  free(hl);
  free(dl);
  free(stage);
  CK(cudaFree(dstage));
  CK(cudaFree(ddst));
  CK(cudaFree(dld));
  CK(cudaFree(acc));
  CK(cudaFree(dbad));
  dis_destroy(&s);
}

static void test_twin_staged(void **state) {
  (void)state;
  for (int round = 0; round < 12; round++)
    twin_staged(round / 2 % 2, round % 2, round >= 8);
}

static void test_twin_clean(void **state) {
  (void)state;
  for (int round = 0; round < 8; round++)
    twin(-1, round % 2);
}

static void test_twin_corrupt(void **state) {
  (void)state;
  for (int round = 0; round < 6; round++)
    twin((int)kt_rand_range(0, 20), round % 2);
}

/* BLOCK_QUANTIZE on the device (one launch over the chunks) == the C reference (and whole-tensor
 * quantization), digests and a changed source byte included. */
static void test_twin_blocks(void **state) {
  (void)state;
  for (int round = 0; round < 6; round++) {
    dbs_t s;
    assert_int_equal(dbs_create(&s, round % 2 ? REFIT_FP8_SCALE_POW2 : REFIT_FP8_SCALE_FP32),
                     REFIT_OK);
    const int corrupt = round >= 4 ? (int)kt_rand_range(0, s.n - 1) : -1;
    const size_t tb = sizeof(s.trainer[0]) * (size_t)s.n;
    /* Host. */
    uint8_t *hsrc = malloc((size_t)s.src_bytes), *hdst = malloc((size_t)s.dst_bytes);
    uint8_t *hdig = calloc(1, (size_t)s.digest_bytes);
    memcpy(hsrc, s.src, (size_t)s.src_bytes);
    memcpy(hdst, s.init, (size_t)s.dst_bytes);
    refit_direct_desc_t ht[DBS_MAX_CHUNKS], hl[DBS_MAX_CHUNKS], dt[DBS_MAX_CHUNKS],
        dl[DBS_MAX_CHUNKS];
    memcpy(ht, s.trainer, tb);
    memcpy(hl, s.land, tb);
    memcpy(dt, s.trainer, tb);
    memcpy(dl, s.land, tb);
    dbs_bind(ht, s.n, hsrc, hdst);
    dbs_bind(hl, s.n, hsrc, hdst);
    assert_int_equal(refit_direct_rows(ht, s.n, 5, hdig, NULL), REFIT_OK);
    /* Device: the trainer's digests there too. */
    uint8_t *dsrc = dev_copy(s.src, (size_t)s.src_bytes);
    uint8_t *ddst = dev_copy(s.init, (size_t)s.dst_bytes);
    uint8_t *ddig = dev_copy(NULL, (size_t)s.digest_bytes);
    dbs_bind(dt, s.n, dsrc, ddst);
    dbs_bind(dl, s.n, dsrc, ddst);
    refit_direct_desc_t *dtt = dev_copy(dt, tb), *dlt = dev_copy(dl, tb);
    unsigned long long *acc = dev_copy(NULL, (size_t)s.n * 8);
    int64_t *dbad = dev_copy(NULL, 8), bad = -1;
    CK(cudaMemcpy(dbad, &bad, 8, cudaMemcpyHostToDevice));
    assert_int_equal(refit_direct_rows_cuda(dtt, s.n, 5, ddig, acc, NULL, 0), REFIT_OK);
    uint8_t *gdig = to_host(ddig, (size_t)s.digest_bytes);
    assert_memory_equal(gdig, hdig, (size_t)s.digest_bytes);
    if (corrupt >= 0) {
      const int64_t off = (const uint8_t *)hl[corrupt].src - hsrc + hl[corrupt].src_pitch + 3;
      hsrc[off] ^= 0x20;
      CK(cudaMemcpy(dsrc + off, hsrc + off, 1, cudaMemcpyHostToDevice));
    }
    int64_t hbad = 7;
    assert_int_equal(refit_direct_rows(hl, s.n, 5, hdig, &hbad), REFIT_OK);
    assert_int_equal(refit_direct_rows_cuda(dlt, s.n, 5, ddig, acc, dbad, 0), REFIT_OK);
    assert_int_equal(refit_direct_blocks_cuda(dl, dlt, s.n, 0), REFIT_OK);
    uint8_t *gdst = to_host(ddst, (size_t)s.dst_bytes);
    CK(cudaMemcpy(&bad, dbad, 8, cudaMemcpyDeviceToHost));
    assert_int_equal(hbad, corrupt);
    assert_int_equal(bad, corrupt);
    if (memcmp(gdst, hdst, (size_t)s.dst_bytes) != 0)
      fail_msg("round %d: block FP8 stores of the CUDA twin differ from the C reference",
               round);
    if (corrupt < 0)
      assert_memory_equal(gdst, s.want, (size_t)s.dst_bytes);
    free(hsrc);
    free(hdst);
    free(hdig);
    free(gdig);
    free(gdst);
    CK(cudaFree(dsrc));
    CK(cudaFree(ddst));
    CK(cudaFree(ddig));
    CK(cudaFree(dtt));
    CK(cudaFree(dlt));
    CK(cudaFree(acc));
    CK(cudaFree(dbad));
    dbs_destroy(&s);
  }
}

int main(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("no GPU: skipped\n");
    return 77;
  }
  kt_seed("test_kernels_direct_cuda");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_twin_clean),
      cmocka_unit_test(test_twin_corrupt),
      cmocka_unit_test(test_twin_staged),
      cmocka_unit_test(test_twin_blocks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * The zero-copy data path's C reference (kernels/direct.c) against an
 * independent statement of the layouts: a random scenario of pitched trainer
 * rows landed chunk by chunk, in shuffled order, straight into the runtime
 * layouts (tests/kernels/direct_scenario.h), byte for byte against whole-tensor
 * quantization followed by the step-by-step MoE oracle and the dense
 * transform; padding written as 0 over random bytes; the trainer's sealed
 * digests accepted, a changed source byte or a stale tag reported as the
 * smallest bad chunk; the same chunks staged as the staged loader lands
 * them (BF16 QUANTIZE and prequantized SPLIT from a staging area, trailers
 * checked); block FP8 chunks of whole blocks quantized in place
 * (BLOCK_QUANTIZE, tests/kernels/direct_block_scenario.h) against whole-tensor
 * quantization, and their digests; the inverse row permutations; and the
 * table check's rules.
 */
#include "direct_block_scenario.h"
#include "direct_scenario.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */

static void run_host(dis_t *s, uint8_t *src, uint8_t *dst, uint8_t *digests, uint64_t tag_t,
                     uint64_t tag_g, int64_t *bad, int corrupt) {
  refit_direct_desc_t *tr = malloc(sizeof(s->trainer)), *ld = malloc(sizeof(s->land));
  memcpy(tr, s->trainer, sizeof(s->trainer));
  memcpy(ld, s->land, sizeof(s->land));
  dis_bind(tr, s->nchunks, src, dst);
  dis_bind(ld, s->n, src, dst);
  assert_int_equal(refit_direct_descs_check(tr, s->nchunks), REFIT_OK);
  assert_int_equal(refit_direct_descs_check(ld, s->n), REFIT_OK);
  assert_int_equal(refit_direct_rows(tr, s->nchunks, tag_t, digests, NULL), REFIT_OK);
  if (corrupt >= 0) {
    /* A byte of chunk `corrupt` and one of a later chunk change after the
     * trainer's digests: the smallest index must be reported. */
    for (int64_t k = corrupt; k < s->nchunks; k += s->nchunks / 3 + 1) {
      uint8_t *at = (uint8_t *)ld[k].src + (ld[k].rows / 2) * ld[k].src_pitch + 1;
      *at ^= 0x08;
    }
  }
  assert_int_equal(refit_direct_rows(ld, s->n, tag_g, digests, bad), REFIT_OK);
  free(tr);
  free(ld);
}

static void test_layouts_exact(void **state) {
  (void)state;
  for (int round = 0; round < 6; round++) {
    dis_t s;
    dis_create_mode(&s, round % 2); /* misaligned, then aligned */
    uint8_t *src = malloc((size_t)s.src_bytes), *dst = malloc((size_t)s.dst_bytes);
    uint8_t *dig = calloc(1, (size_t)s.digest_bytes);
    memcpy(src, s.src, (size_t)s.src_bytes);
    memcpy(dst, s.init, (size_t)s.dst_bytes);
    int64_t bad = 7;
    run_host(&s, src, dst, dig, 42, 42, &bad, -1);
    assert_int_equal(bad, -1);
    for (int i = 0; i < DIS_TENSORS; i++) {
      const dis_tensor_t *t = &s.t[i];
      if (memcmp(dst + t->w_off, s.want + t->w_off, (size_t)t->w_bytes) != 0)
        fail_msg("tensor %d: values differ from the oracle", i);
      if (t->quantized && memcmp(dst + t->s_off, s.want + t->s_off, (size_t)t->s_bytes) != 0)
        fail_msg("tensor %d: scales differ from the oracle", i);
    }
    assert_memory_equal(dst, s.want, (size_t)s.dst_bytes);
    free(src);
    free(dst);
    free(dig);
    dis_destroy(&s);
  }
}

/* The staged loader's landing (loader.c): wire chunks read from a staging
 * area at any alignment, BF16 quantized (QUANTIZE) or prequantized split
 * (SPLIT) straight into the layouts, each checked against its trailer; the
 * same stores as the oracle's, and a flipped staged byte reported. */
static void test_staged_exact(void **state) {
  (void)state;
  for (int round = 0; round < 8; round++) {
    dis_t s;
    dis_create_mode(&s, round % 2);
    int64_t sbytes = 0;
    uint8_t *stage = dis_stage(&s, round / 2 % 2, 7, &sbytes);
    uint8_t *dst = malloc((size_t)s.dst_bytes);
    memcpy(dst, s.init, (size_t)s.dst_bytes);
    refit_direct_desc_t *ld = malloc(sizeof(s.land));
    memcpy(ld, s.land, sizeof(s.land));
    dis_bind(ld, s.n, NULL, dst);
    assert_int_equal(refit_direct_descs_check(ld, s.n), REFIT_OK);
    const int flip = round >= 4;
    const int64_t victim = s.nchunks / 2;
    if (flip)
      stage[ld[victim].src_offset + ld[victim].rows * ld[victim].src_pitch / 2] ^= 0x10;
    int64_t bad = 7;
    assert_int_equal(refit_direct_rows(ld, s.n, 7, stage, &bad), REFIT_OK);
    if (flip) {
      assert_int_equal(bad, victim);
    } else {
      assert_int_equal(bad, -1);
      assert_memory_equal(dst, s.want, (size_t)s.dst_bytes);
    }
    free(ld);
    free(dst);
    free(stage);
    dis_destroy(&s);
  }
}

static void test_digests_catch(void **state) {
  (void)state;
  dis_t s;
  dis_create(&s);
  uint8_t *src = malloc((size_t)s.src_bytes), *dst = malloc((size_t)s.dst_bytes);
  uint8_t *dig = calloc(1, (size_t)s.digest_bytes);
  int64_t bad = 0;
  /* A changed byte. */
  const int64_t corrupt = kt_rand_range(0, s.nchunks / 2);
  memcpy(src, s.src, (size_t)s.src_bytes);
  run_host(&s, src, dst, dig, 42, 42, &bad, (int)corrupt);
  assert_int_equal(bad, corrupt);
  /* Digests sealed for another refit: the first chunk with rows fails. */
  memcpy(src, s.src, (size_t)s.src_bytes);
  run_host(&s, src, dst, dig, 41, 42, &bad, -1);
  assert_int_equal(bad, 0);
  free(src);
  free(dst);
  free(dig);
  dis_destroy(&s);
}

static void test_inverse_perms(void **state) {
  (void)state;
  const refit_kernels_perm_kind_t kinds[3] = {REFIT_KERNELS_PERM_SRC32, REFIT_KERNELS_PERM_DST32,
                                              REFIT_KERNELS_PERM_SRC13};
  for (int k = 0; k < 3; k++)
    for (int64_t rows = 64; rows <= 640; rows += 64) {
      const int32_t *perm = NULL;
      assert_int_equal(refit_kernels_perm_get(kinds[k], rows, &perm), REFIT_OK);
      for (int64_t j = 0; j < rows; j++)
        assert_int_equal(refit_kernels_perm_inverse_index(kinds[k], rows, perm[j]), j);
    }
}

static void test_table_rules(void **state) {
  (void)state;
  uint8_t buf[4096];
  refit_direct_desc_t ok = {0};
  ok.op = REFIT_DIRECT_QUANTIZE;
  ok.src = buf;
  ok.src_pitch = 128;
  ok.rows = 2;
  ok.cols = 64;
  ok.dst = buf;
  ok.scale = buf;
  ok.k = 64;
  ok.group_rows = ok.perm_rows = 64;
  ok.perm = REFIT_KERNELS_PERM_SRC32;
  assert_int_equal(refit_direct_descs_check(&ok, 1), REFIT_OK);
  refit_direct_desc_t d = ok;
  d.cols = 48;
  assert_int_equal(refit_direct_descs_check(&d, 1), REFIT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(refit_last_error(), "direct descriptor 0"));
  d = ok;
  d.col0 = 32; /* col0 + cols > k */
  assert_int_equal(refit_direct_descs_check(&d, 1), REFIT_ERR_INVALID_ARGUMENT);
  d = ok;
  d.perm_rows = 96; /* not a multiple of 64 for src13 */
  d.perm = REFIT_KERNELS_PERM_SRC13;
  assert_int_equal(refit_direct_descs_check(&d, 1), REFIT_ERR_INVALID_ARGUMENT);
  d = ok;
  d.src_pitch = 100;
  assert_int_equal(refit_direct_descs_check(&d, 1), REFIT_ERR_INVALID_ARGUMENT);
  d = ok;
  d.op = 9;
  assert_int_equal(refit_direct_descs_check(&d, 1), REFIT_ERR_INVALID_ARGUMENT);
  d = ok;
  d.digest = 1;
  d.digest_offset = 4;
  assert_int_equal(refit_direct_descs_check(&d, 1), REFIT_ERR_INVALID_ARGUMENT);
  d = ok;
  d.op = REFIT_DIRECT_PAD;
  d.digest = 1;
  assert_int_equal(refit_direct_descs_check(&d, 1), REFIT_ERR_INVALID_ARGUMENT);
  /* A digest with no buffer to hold it. */
  d = ok;
  d.digest = 1;
  assert_int_equal(refit_direct_rows(&d, 1, 1, NULL, NULL), REFIT_ERR_INVALID_ARGUMENT);
}

/* BLOCK_QUANTIZE: chunks of whole blocks, each quantized alone in place,
 * equal the whole tensors quantized at once (both scale modes); the scale
 * rows and values not written stay as they were only where no chunk lands
 * (none here: every byte is checked); a changed source byte after the
 * trainer's digests is reported as the smallest bad chunk. */
static void test_blocks_exact(void **state) {
  (void)state;
  for (int round = 0; round < 6; round++) {
    dbs_t s;
    assert_int_equal(dbs_create(&s, round % 2 ? REFIT_FP8_SCALE_POW2 : REFIT_FP8_SCALE_FP32),
                     REFIT_OK);
    uint8_t *dst = malloc((size_t)s.dst_bytes), *dig = calloc(1, (size_t)s.digest_bytes);
    memcpy(dst, s.init, (size_t)s.dst_bytes);
    refit_direct_desc_t tr[DBS_MAX_CHUNKS], ld[DBS_MAX_CHUNKS];
    memcpy(tr, s.trainer, sizeof(tr));
    memcpy(ld, s.land, sizeof(ld));
    dbs_bind(tr, s.n, s.src, dst);
    dbs_bind(ld, s.n, s.src, dst);
    assert_int_equal(refit_direct_descs_check(ld, s.n), REFIT_OK);
    assert_int_equal(refit_direct_rows(tr, s.n, 9, dig, NULL), REFIT_OK);
    const int corrupt = round >= 4 ? (int)kt_rand_range(0, s.n - 1) : -1;
    if (corrupt >= 0)
      ((uint8_t *)(uintptr_t)ld[corrupt].src)[ld[corrupt].src_pitch + 3] ^= 0x20;
    int64_t bad = 7;
    assert_int_equal(refit_direct_rows(ld, s.n, 9, dig, &bad), REFIT_OK);
    assert_int_equal(bad, corrupt);
    if (corrupt < 0 && memcmp(dst, s.want, (size_t)s.dst_bytes) != 0)
      fail_msg("round %d: block FP8 stores differ from whole-tensor quantization", round);
    free(dst);
    free(dig);
    dbs_destroy(&s);
  }
  /* The table rules of the op. */
  dbs_t s;
  assert_int_equal(dbs_create(&s, REFIT_FP8_SCALE_FP32), REFIT_OK);
  refit_direct_desc_t d = s.land[0];
  dbs_bind(&d, 1, s.src, s.init);
  d.fp8_scale = 2;
  assert_int_equal(refit_direct_descs_check(&d, 1), REFIT_ERR_INVALID_ARGUMENT);
  d.fp8_scale = 0;
  d.staged = 1;
  assert_int_equal(refit_direct_descs_check(&d, 1), REFIT_ERR_INVALID_ARGUMENT);
  d.staged = 0;
  d.dst_pitch = d.cols - 1;
  assert_int_equal(refit_direct_descs_check(&d, 1), REFIT_ERR_INVALID_ARGUMENT);
  dbs_destroy(&s);
}

int main(void) {
  kt_seed("test_kernels_direct");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layouts_exact),
      cmocka_unit_test(test_staged_exact),
      cmocka_unit_test(test_digests_catch),
      cmocka_unit_test(test_inverse_perms),
      cmocka_unit_test(test_table_rules),
      cmocka_unit_test(test_blocks_exact),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

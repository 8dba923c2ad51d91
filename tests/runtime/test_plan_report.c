/*
 * refit/plan.h: the public planning API, as a client that includes nothing
 * else sees it. Every contract of the header: what open refuses, the order
 * of build and queries, the ranges of the per-rank query, figures that
 * agree with each other, and the plans build refuses (a block FP8 tensor
 * that falls back to BF16 under delta: on).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "refit/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_open_refuses(void **state) {
  (void)state;
  refit_plan_report_h r = NULL;
  char *errors = NULL;
  assert_int_equal(refit_plan_report_open("/nonexistent/job.yaml", &r, &errors),
                   REFIT_ERR_SYSTEM);
  assert_null(r);
  assert_non_null(errors);
  assert_non_null(strstr(errors, "/nonexistent/job.yaml: cannot open"));
  free(errors);
  assert_int_equal(refit_plan_report_open(NULL, &r, NULL), REFIT_ERR_INVALID_ARGUMENT);
  refit_plan_report_close(NULL);
}

static void test_figures_agree(void **state) {
  (void)state;
  refit_plan_report_h r = NULL;
  char *errors = NULL;
  assert_int_equal(refit_plan_report_open(REFIT_CONFIGS_DIR "/demo.yaml", &r, &errors),
                   REFIT_OK);
  assert_null(errors);
  int trainers = 0, generators = 0;
  assert_int_equal(refit_plan_report_world(r, &trainers, &generators), REFIT_OK);
  assert_true(trainers > 0 && generators > 0);

  /* Queries wait for the plan; the plan is built once. */
  refit_plan_figures_t f;
  refit_plan_prediction_t p;
  int64_t bytes = 0;
  const refit_plan_links_t links = {
      .link_gbps = 25, .nvlink_gbps = 450, .gpus_per_node = 0};
  assert_int_equal(refit_plan_report_figures(r, &f), REFIT_ERR_STATE);
  assert_int_equal(refit_plan_report_predict(r, &links, &p), REFIT_ERR_STATE);
  assert_int_equal(refit_plan_report_rank_bytes(r, REFIT_PLAN_SIDE_TRAINER, 0, &bytes),
                   REFIT_ERR_STATE);
  assert_int_equal(refit_plan_report_build(r), REFIT_OK);
  assert_int_equal(refit_plan_report_build(r), REFIT_ERR_STATE);

  assert_int_equal(refit_plan_report_figures(r, &f), REFIT_OK);
  assert_int_equal(f.trainers, trainers);
  assert_int_equal(f.generators, generators);
  assert_true(f.parameters > 0 && f.trainer_tensors > 0);
  assert_true(f.chunks >= f.messages && f.messages > 0 && f.buckets > 0);
  assert_true(f.spread >= 0 && f.spread <= 1);
  assert_true(f.hash != 0);
  assert_int_equal(f.delta, 0); /* refit.delta off: no baselines */
  assert_int_equal(f.delta_trainer_bytes, 0);
  assert_int_equal(f.delta_generator_bytes, 0);

  /* Per-rank bytes sum to the total on both sides; the maxima are theirs. */
  assert_int_equal(refit_plan_report_predict(r, &links, &p), REFIT_OK);
  int64_t sum[2] = {0, 0}, max[2] = {0, 0};
  for (int side = 0; side < 2; side++)
    for (int k = 0; k < (side ? generators : trainers); k++) {
      assert_int_equal(
          refit_plan_report_rank_bytes(r, (refit_plan_side_t)side, k, &bytes), REFIT_OK);
      sum[side] += bytes;
      max[side] = bytes > max[side] ? bytes : max[side];
    }
  assert_int_equal(sum[0], p.total_bytes);
  assert_int_equal(sum[1], p.total_bytes);
  assert_int_equal(max[0], p.egress_max);
  assert_int_equal(max[1], p.ingress_max);
  assert_true(p.floor_s > 0 && p.predicted_s >= p.floor_s);

  /* Out of range. */
  assert_int_equal(
      refit_plan_report_rank_bytes(r, REFIT_PLAN_SIDE_TRAINER, trainers, &bytes),
      REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_plan_report_rank_bytes(r, REFIT_PLAN_SIDE_GENERATOR, -1, &bytes),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_plan_report_rank_bytes(r, (refit_plan_side_t)2, 0, &bytes),
                   REFIT_ERR_INVALID_ARGUMENT);
  const refit_plan_links_t none = {.link_gbps = 0};
  assert_int_equal(refit_plan_report_predict(r, &none, &p), REFIT_ERR_INVALID_ARGUMENT);
  refit_plan_report_close(r);
}

/* The report of `yaml` (written to a file), built with status `want`
 * (closed unless REFIT_OK). */
static refit_plan_report_h open_text_as(const char *yaml, refit_status_t want) {
  char path[] = "/tmp/test_plan_report_XXXXXX";
  const int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  assert_non_null(f);
  fputs(yaml, f);
  fclose(f);
  refit_plan_report_h r = NULL;
  assert_int_equal(refit_plan_report_open(path, &r, NULL), REFIT_OK);
  unlink(path);
  assert_int_equal(refit_plan_report_build(r), want);
  if (want == REFIT_OK)
    return r;
  refit_plan_report_close(r);
  return NULL;
}

/* The figures of `yaml` (written to a file), built. */
static refit_plan_report_h open_text(const char *yaml) {
  return open_text_as(yaml, REFIT_OK);
}

/* refit.delta: a trainer's baseline is what it packs: with two engines
 * every message goes to both, and is kept once; a generator keeps no
 * baseline (it applies deltas in place), two digests per chunk it lands. */
static void test_delta_baselines(void **state) {
  (void)state;
  static const char job[] = "model:\n  family: qwen3_moe\n  hidden_size: 256\n"
                            "  num_layers: 2\n  num_attention_heads: 4\n"
                            "  num_kv_heads: 2\n  head_dim: 64\n  vocab_size: 1024\n"
                            "  num_experts: 4\n  moe_intermediate_size: 128\n"
                            "trainer:\n  tp: 2\ngenerator:\n  tp: 2\n  engines: %d\n"
                            "refit:\n  precision: mxfp8\n  delta: %s\n";
  char text[1024];
  refit_plan_figures_t f;
  refit_plan_links_t links = {.link_gbps = 25};
  refit_plan_prediction_t p;
  for (int engines = 1; engines <= 2; engines++) {
    snprintf(text, sizeof(text), job, engines, engines == 1 ? "on" : "auto");
    refit_plan_report_h r = open_text(text);
    assert_int_equal(refit_plan_report_figures(r, &f), REFIT_OK);
    assert_int_equal(refit_plan_report_predict(r, &links, &p), REFIT_OK);
    assert_int_equal(f.delta, engines == 1 ? 1 : 2);
    assert_true(f.delta_generator_bytes > 0);
    assert_true(f.delta_generator_bytes <= 16 * f.chunks);
    assert_true(f.delta_generator_bytes < p.ingress_max / 16);
    /* Digests (8 bytes a chunk) come on top of the bytes moved. */
    const int64_t sent = p.egress_max / engines;
    assert_true(f.delta_trainer_bytes >= sent);
    assert_true(f.delta_trainer_bytes <= sent + 8 * f.chunks);
    refit_plan_report_close(r);
  }
}

/* Block FP8 delta refits: with trainer tp 4, qkv_proj's k and v pieces are
 * 64 rows a trainer, which split a 128-row block, so qkv_proj travels BF16
 * and is quantized on the generator: delta: on refuses the plan, naming the
 * tensor, the trainer rank, its rows and what to change; delta: auto plans
 * (its refits are full); at trainer tp 2 every tensor is quantized on the
 * trainer and delta: on plans. */
static void test_delta_block_fallback(void **state) {
  (void)state;
  static const char job[] = "model:\n  family: llama\n  hidden_size: 256\n"
                            "  num_layers: 2\n  num_attention_heads: 8\n"
                            "  num_kv_heads: 4\n  head_dim: 64\n  vocab_size: 512\n"
                            "  intermediate_size: 512\n"
                            "trainer:\n  tp: %d\ngenerator:\n  tp: 2\n"
                            "refit:\n  precision: fp8_block\n  prequantize: true\n"
                            "  delta: %s\n";
  char text[1024];
  snprintf(text, sizeof(text), job, 4, "on");
  assert_null(open_text_as(text, REFIT_ERR_CONFIG));
  const char *why = refit_last_error();
  static const char *const parts[] = {
      "refit.delta: on: model.layers.*.self_attn.qkv_proj.weight on generator tp rank 0 "
      "(4 of the 16 block FP8 tensors of the generator's tp ranks) travels BF16 under "
      "refit.prequantize and is quantized on the generator, where no delta applies in "
      "place: trainer rank 0 holds its rows 256..319, columns 0..255 (of trainer tensor "
      "model.layers.0.self_attn.k_proj.weight), which are not whole 128 x 128 blocks",
      "or set delta: auto (full refits for this layout) or delta: off"};
  for (int i = 0; i < 2; i++)
    if (strstr(why, parts[i]) == NULL)
      fail_msg("the refusal lacks '%s': %s", parts[i], why);
  snprintf(text, sizeof(text), job, 4, "auto");
  refit_plan_report_close(open_text(text));
  snprintf(text, sizeof(text), job, 2, "on");
  refit_plan_report_h r = open_text(text);
  refit_plan_figures_t f;
  assert_int_equal(refit_plan_report_figures(r, &f), REFIT_OK);
  assert_int_equal(f.delta, 1);
  refit_plan_report_close(r);
}

/* The pipelined prediction (refit_plan_report_pipeline): every bucket's
 * stages in the lifecycle's order, the restore save where sync mode keeps
 * one, the async commit's copy, the overlaps in their order, AUTO resolved
 * from the transport, and with free passes the link prediction itself. */
static void test_pipeline(void **state) {
  (void)state;
  static const char job[] = "model:\n  family: qwen3_moe\n  hidden_size: 256\n"
                            "  num_layers: 2\n  num_attention_heads: 4\n"
                            "  num_kv_heads: 2\n  head_dim: 64\n  vocab_size: 1024\n"
                            "  num_experts: 4\n  moe_intermediate_size: 128\n"
                            "trainer:\n  tp: 2\ngenerator:\n  tp: 2\n  engines: 2\n"
                            "refit:\n  bucket_bytes: 64KiB\n  transport: %s\n"
                            "  mode: %s\n  restore: %s\n";
  static const struct {
    const char *transport, *mode, *restore;
    refit_plan_overlap_t overlap; /* what AUTO resolves to */
  } jobs[] = {{"mpi", "sync", "full", REFIT_PLAN_OVERLAP_PACK},
              {"ucx\n  device_map: none", "sync", "none", REFIT_PLAN_OVERLAP_NONE},
              {"auto", "async", "full", REFIT_PLAN_OVERLAP_FULL}};
  const refit_plan_links_t links = {.link_gbps = 25};
  for (size_t j = 0; j < sizeof(jobs) / sizeof(jobs[0]); j++) {
    char text[1024];
    snprintf(text, sizeof(text), job, jobs[j].transport, jobs[j].mode, jobs[j].restore);
    refit_plan_report_h r = open_text(text);
    refit_plan_figures_t f;
    refit_plan_prediction_t p;
    assert_int_equal(refit_plan_report_figures(r, &f), REFIT_OK);
    assert_int_equal(refit_plan_report_predict(r, &links, &p), REFIT_OK);
    assert_true(f.buckets > 2);
    refit_plan_bucket_t *b = calloc((size_t)f.buckets, sizeof(*b));
    assert_non_null(b);
    refit_plan_pipeline_prediction_t pl;
    refit_plan_copy_t copy = {.copy_gbps = 10, .overlap = REFIT_PLAN_OVERLAP_AUTO};
    assert_int_equal(refit_plan_report_pipeline(r, &links, &copy, b, &pl), REFIT_OK);
    assert_int_equal(pl.overlap, jobs[j].overlap);
    const int sync = strcmp(jobs[j].mode, "sync") == 0;
    const int saves = sync && strcmp(jobs[j].restore, "full") == 0;
    int64_t saved = 0;
    double last = 0;
    for (int k = 0; k < f.buckets; k++) {
      assert_true(b[k].pack_bytes > 0 && b[k].land_bytes > 0);
      assert_true(b[k].pack_end_s >= b[k].pack_s);
      assert_true(b[k].transfer_end_s >= b[k].pack_end_s + b[k].transfer_s - 1e-12);
      assert_true(b[k].land_end_s >= b[k].transfer_end_s + b[k].land_s - 1e-12);
      assert_true(b[k].land_end_s >= last);
      last = b[k].land_end_s;
      saved += b[k].save_bytes;
    }
    /* The save copies what a generator rank holds once; none without it. */
    if (saves)
      assert_true(saved >= p.ingress_max - 8 * f.chunks && saved <= 2 * p.ingress_max);
    else
      assert_int_equal(saved, 0);
    assert_int_equal(pl.save_bytes, saved);
    assert_true(sync ? pl.commit_s == 0 : pl.commit_s > 0);
    assert_true(pl.total_s == last + pl.commit_s);

    /* Fewer overlaps, no shorter a refit. */
    double total[3];
    const refit_plan_overlap_t order[3] = {
        REFIT_PLAN_OVERLAP_FULL, REFIT_PLAN_OVERLAP_PACK, REFIT_PLAN_OVERLAP_NONE};
    for (int k = 0; k < 3; k++) {
      copy.overlap = order[k];
      assert_int_equal(refit_plan_report_pipeline(r, &links, &copy, NULL, &pl), REFIT_OK);
      assert_int_equal(pl.overlap, order[k]);
      total[k] = pl.total_s;
    }
    assert_true(total[0] <= total[1] && total[1] <= total[2]);
    assert_true(total[2] > total[0]);

    /* Passes that cost nothing leave the links, bucket after bucket. */
    copy.copy_gbps = 1e12;
    assert_int_equal(refit_plan_report_pipeline(r, &links, &copy, NULL, &pl), REFIT_OK);
    assert_true(pl.total_s > p.predicted_s * (1 - 1e-6) &&
                pl.total_s < p.predicted_s * (1 + 1e-6));
    copy.copy_gbps = 0;
    assert_int_equal(refit_plan_report_pipeline(r, &links, &copy, NULL, &pl),
                     REFIT_ERR_INVALID_ARGUMENT);
    free(b);
    refit_plan_report_close(r);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_open_refuses),
      cmocka_unit_test(test_figures_agree),
      cmocka_unit_test(test_delta_baselines),
      cmocka_unit_test(test_delta_block_fallback),
      cmocka_unit_test(test_pipeline),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

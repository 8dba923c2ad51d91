/*
 * Planner properties over a grid of layouts, checked element by element
 * against the from-definition reference (reshard/reference.c):
 * - every byte of every generator runtime tensor is covered exactly once;
 * - every chunk reads inside a shard that its trainer rank really holds, and
 *   the element it reads is the one the vLLM rules name;
 * - byte totals are what the runtime tensor shapes say;
 * - no generator rank stages more than bucket_bytes in one bucket;
 * - messages tile the staging area without gaps or overlap;
 * - every bucket is balanced: each trainer sends its share of it, so the
 *   bucket-by-bucket prediction is within 1.2x of the floor;
 * - the MXFP8 arena stays within refit.arena_bytes or the plan is refused;
 * - byte counts near the model bounds plan or are refused, never truncated.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reshard/blocks.h"
#include "reshard/catalog.h"
#include "reshard/plan.h"
#include "reshard/reference.h"

static refit_model_t grid_moe(void) {
  refit_model_t m = {0};
  m.family = REFIT_FAMILY_QWEN3_MOE;
  m.hidden_size = 32;
  m.num_layers = 4;
  m.num_attention_heads = 16;
  m.num_kv_heads = 8;
  m.head_dim = 4;
  m.vocab_size = 64;
  m.num_experts = 8;
  m.moe_intermediate_size = 16;
  return m;
}

static refit_model_t grid_dense(void) {
  refit_model_t m = grid_moe();
  m.family = REFIT_FAMILY_QWEN3;
  m.num_experts = 0;
  m.moe_intermediate_size = 0;
  m.intermediate_size = 32;
  m.tie_word_embeddings = 1;
  return m;
}

/* Which part of trainer tensor t does rank `rank` hold, or -1. */
static int holder_part(const refit_catalog_t *cat, const refit_src_tensor_t *t,
                       int32_t rank) {
  for (int32_t p = 0; p < t->nparts; p++)
    for (int32_t r = 0; r < t->nreplicas; r++)
      if (refit_src_holder(cat, t, p, r) == rank)
        return p;
  return -1;
}

typedef struct {
  int64_t layouts;
  int64_t chunks;
} grid_tally_t;

/* Check one plan completely; returns nothing, fails the test on a mismatch. */
static void check_plan(const refit_catalog_t *cat, const refit_plan_t *plan,
                       uint64_t bucket_bytes) {
  const refit_generator_layout_t *gl = &cat->generator;
  const int32_t G = plan->ngenerator;
  int64_t ngen_per_rank = cat->gen_begin[1] - cat->gen_begin[0];
  (void)ngen_per_rank;

  /* Element counters: one array per (generator rank, runtime tensor). */
  int64_t total_elems = 0;
  int64_t *base = calloc((size_t)G * (size_t)(cat->gen_begin[gl->tp]) + 1,
                         sizeof(int64_t));
  assert_non_null(base);
  for (int32_t g = 0; g < G; g++) {
    int t = g % gl->tp;
    for (int64_t i = cat->gen_begin[t]; i < cat->gen_begin[t + 1]; i++) {
      base[(int64_t)g * cat->gen_begin[gl->tp] + i] = total_elems;
      total_elems += cat->gen[i].rows * cat->gen[i].cols;
    }
  }
  unsigned char *count = calloc((size_t)total_elems, 1);
  assert_non_null(count);

  int64_t expect_bytes = 0, got_bytes = 0;
  for (int32_t g = 0; g < G; g++) {
    int t = g % gl->tp;
    for (int64_t i = cat->gen_begin[t]; i < cat->gen_begin[t + 1]; i++)
      expect_bytes += cat->gen[i].rows * cat->gen[i].cols * 2;
  }

  for (int64_t ci = 0; ci < plan->nchunks; ci++) {
    const refit_chunk_t *c = &plan->chunks[ci];
    const refit_src_tensor_t *src = &cat->src[c->src_tensor];
    const refit_gen_tensor_t *gen = &cat->gen[c->dst_tensor];
    const int t = c->dst_rank % gl->tp;
    int64_t shard_rows, shard_cols;

    assert_true(c->dst_tensor >= cat->gen_begin[t] &&
                c->dst_tensor < cat->gen_begin[t + 1]);
    int part = holder_part(cat, src, c->src_rank);
    assert_int_not_equal(part, -1);
    refit_src_shard_shape(src, &shard_rows, &shard_cols);
    assert_true(c->rows > 0 && c->cols > 0);
    assert_true(c->src_row >= 0 && c->src_row + c->rows <= shard_rows);
    assert_true(c->src_col >= 0 && c->src_col + c->cols <= shard_cols);
    assert_true(c->dst_row >= 0 && c->dst_row + c->rows <= gen->rows);
    assert_true(c->dst_col >= 0 && c->dst_col + c->cols <= gen->cols);
    int64_t grow0 = c->src_row + (src->split == REFIT_SPLIT_ROWS ? part * shard_rows : 0);
    int64_t gcol0 = c->src_col + (src->split == REFIT_SPLIT_COLS ? part * shard_cols : 0);
    assert_int_equal(c->row_bytes, c->cols * 2);
    got_bytes += c->rows * c->row_bytes;

    for (int64_t r = 0; r < c->rows; r++) {
      char name[REFIT_NAME_MAX];
      int64_t ref_row, ref_col_off;
      assert_int_equal(refit_reference_source_row(&cat->model, gl, t, gen->name,
                                                  c->dst_row + r, name, &ref_row,
                                                  &ref_col_off),
                       REFIT_OK);
      assert_string_equal(name, src->name);
      assert_int_equal(ref_row, grow0 + r);
      assert_int_equal(ref_col_off + c->dst_col, gcol0);
      unsigned char *cnt = count +
                           base[(int64_t)c->dst_rank * cat->gen_begin[gl->tp] +
                                c->dst_tensor] +
                           (c->dst_row + r) * gen->cols + c->dst_col;
      for (int64_t k = 0; k < c->cols; k++)
        cnt[k]++;
    }
  }
  for (int64_t e = 0; e < total_elems; e++)
    if (count[e] != 1)
      fail_msg("element %lld covered %d times", (long long)e, count[e]);
  assert_int_equal(got_bytes, expect_bytes);

  int64_t ingress = 0, egress = 0;
  for (int32_t g = 0; g < G; g++) {
    ingress += plan->ingress[g];
    assert_true(plan->staging[g] <= (int64_t)bucket_bytes);
  }
  for (int32_t r = 0; r < plan->ntrainer; r++)
    egress += plan->egress[r];
  assert_int_equal(ingress, expect_bytes);
  assert_int_equal(egress, expect_bytes);

  /* Messages tile each (bucket, destination) staging area from offset 0. */
  int64_t expect_off = 0;
  for (int64_t mi = 0; mi < plan->nmsgs; mi++) {
    const refit_msg_t *m = &plan->msgs[mi];
    if (mi == 0 || m->bucket != m[-1].bucket || m->dst_rank != m[-1].dst_rank)
      expect_off = 0;
    assert_int_equal(m->offset, expect_off);
    int64_t off = m->offset;
    for (int64_t k = 0; k < m->chunk_count; k++) {
      const refit_chunk_t *c = &plan->chunks[m->chunk_begin + k];
      assert_int_equal(c->offset, off);
      assert_int_equal(c->src_rank, m->src_rank);
      assert_int_equal(c->dst_rank, m->dst_rank);
      assert_int_equal(c->bucket, m->bucket);
      off += c->rows * c->row_bytes + plan->options.chunk_trailer;
    }
    assert_int_equal(off - m->offset, m->bytes);
    expect_off += m->bytes;
  }
  for (int32_t b = 0; b < plan->nbuckets; b++)
    for (int64_t mi = plan->bucket_msg_begin[b]; mi < plan->bucket_msg_begin[b + 1];
         mi++)
      assert_int_equal(plan->msgs[mi].bucket, b);
  free(count);
  free(base);
}

static void plan_and_check(const refit_model_t *m, const refit_trainer_layout_t *tl,
                           const refit_generator_layout_t *gl, uint64_t bucket,
                           grid_tally_t *tally) {
  refit_catalog_t *cat = NULL;
  refit_plan_t *plan = NULL;
  /* Alternate plans with and without an 8-byte digest trailer per chunk. */
  refit_plan_options_t opt = {.bucket_bytes = bucket, .wire = REFIT_WIRE_BF16,
                              .chunk_trailer = (tally->layouts & 1) ? 8 : 0};

  if (refit_catalog_create(m, tl, gl, &cat) != REFIT_OK)
    return; /* a layout the rules reject; the config tests cover those */
  if (refit_plan_create(cat, &opt, &plan) != REFIT_OK)
    fail_msg("plan failed: %s", refit_last_error());
  check_plan(cat, plan, bucket);
  tally->layouts++;
  tally->chunks += plan->nchunks;
  refit_plan_destroy(plan);
  refit_catalog_destroy(cat);
}

static void test_grid_moe(void **state) {
  (void)state;
  static const int tps[] = {1, 2, 4, 8}, pps[] = {1, 2, 4}, eps[] = {1, 2, 4, 8};
  grid_tally_t tally = {0};
  refit_model_t m = grid_moe();
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 3; b++)
      for (int c = 0; c < 4; c++)
        for (int etp = 1; etp <= 2; etp++)
          for (int dp = 1; dp <= 2; dp++)
            for (int d = 0; d < 4; d++)
              for (int gep = 0; gep < 2; gep++)
                for (int eng = 1; eng <= 2; eng++) {
                  refit_trainer_layout_t tl = {.tp = tps[a], .pp = pps[b],
                                               .ep = eps[c], .etp = etp, .dp = dp};
                  refit_generator_layout_t gl = {
                      .tp = tps[d], .ep = gep ? tps[d] : 1, .engines = eng};
                  if (gep && tps[d] == 1)
                    continue;
                  plan_and_check(&m, &tl, &gl, 2048, &tally);
                }
  print_message("moe grid: %lld layouts, %lld chunks\n", (long long)tally.layouts,
                (long long)tally.chunks);
  assert_true(tally.layouts > 500);
}

static void test_grid_dense(void **state) {
  (void)state;
  static const int tps[] = {1, 2, 4, 8}, pps[] = {1, 2, 4};
  grid_tally_t tally = {0};
  refit_model_t m = grid_dense();
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 3; b++)
      for (int dp = 1; dp <= 2; dp++)
        for (int d = 0; d < 4; d++)
          for (int eng = 1; eng <= 2; eng++) {
            refit_trainer_layout_t tl = {.tp = tps[a], .pp = pps[b], .ep = 1,
                                         .etp = 1, .dp = dp};
            refit_generator_layout_t gl = {.tp = tps[d], .ep = 1, .engines = eng};
            plan_and_check(&m, &tl, &gl, 4096, &tally);
          }
  assert_int_equal(tally.layouts, 4 * 3 * 2 * 4 * 2);
}

/* DeepSeek-V3's architecture (MLA with and without q LoRA, a dense first
 * layer, routed and shared experts, the routers' FP32 bias) over trainer
 * tp, pp, ep, dp and generator tp, ep and engines; every segment checked
 * against the from-definition reference (Hugging Face names: Megatron's
 * are checked by the caller tests against tests/caller/megatron_rules.py). */
static void test_grid_deepseek(void **state) {
  (void)state;
  static const int tps[] = {1, 2, 4}, eps[] = {1, 2, 4};
  grid_tally_t tally = {0};
  refit_model_t m = {.family = REFIT_FAMILY_DEEPSEEK_V3,
                     .hidden_size = 32,
                     .num_layers = 4,
                     .num_attention_heads = 8,
                     .num_kv_heads = 8,
                     .head_dim = 4,
                     .vocab_size = 64,
                     .intermediate_size = 32,
                     .num_experts = 8,
                     .moe_intermediate_size = 16,
                     .kv_lora_rank = 16,
                     .qk_nope_head_dim = 4,
                     .v_head_dim = 4,
                     .num_shared_experts = 1,
                     .first_k_dense_replace = 1,
                     .expert_bias = 1};
  for (int q_lora = 0; q_lora <= 16; q_lora += 16)
    for (int etp = 1; etp <= 2; etp++)
      for (int a = 0; a < 3; a++)
        for (int pp = 1; pp <= 2; pp++)
          for (int c = 0; c < 3; c++)
            for (int dp = 1; dp <= 2; dp++)
              for (int d = 0; d < 3; d++)
                for (int gep = 0; gep < 2; gep++) {
                  m.q_lora_rank = q_lora;
                  refit_trainer_layout_t tl = {
                      .tp = tps[a], .pp = pp, .ep = eps[c], .etp = etp, .dp = dp};
                  refit_generator_layout_t gl = {
                      .tp = tps[d], .ep = gep ? tps[d] : 1, .engines = 1 + dp % 2};
                  if (gep && tps[d] == 1)
                    continue;
                  plan_and_check(&m, &tl, &gl, 2048, &tally);
                }
  print_message("deepseek grid: %lld layouts, %lld chunks\n", (long long)tally.layouts,
                (long long)tally.chunks);
  assert_true(tally.layouts > 200);
}

/* tp_gen > num_kv_heads: ranks that share a KV head all receive it. */
static void test_kv_replication(void **state) {
  (void)state;
  grid_tally_t tally = {0};
  refit_model_t m = grid_moe();
  m.num_kv_heads = 2;
  for (int ttp = 1; ttp <= 2; ttp *= 2)
    for (int gtp = 4; gtp <= 16; gtp *= 2) {
      if (m.num_attention_heads % gtp != 0)
        continue;
      refit_trainer_layout_t tl = {.tp = ttp, .pp = 1, .ep = 1, .etp = 1, .dp = 2};
      refit_generator_layout_t gl = {.tp = gtp, .ep = gtp, .engines = 1};
      plan_and_check(&m, &tl, &gl, 1024, &tally);
    }
  assert_int_equal(tally.layouts, 4);
}

/* Uneven pipeline stages: first and last stage hold one layer each. */
static void test_uneven_stages(void **state) {
  (void)state;
  grid_tally_t tally = {0};
  refit_model_t m = grid_moe();
  int64_t first[5];
  m.num_layers = 6;
  refit_trainer_layout_t tl = {.tp = 2, .pp = 4, .ep = 2, .etp = 1, .dp = 1,
                               .first_stage_layers = 1, .last_stage_layers = 1};
  assert_int_equal(refit_stage_layers(&m, &tl, first), REFIT_OK);
  assert_int_equal(first[1], 1);
  assert_int_equal(first[2], 3);
  assert_int_equal(first[3], 5);
  assert_int_equal(first[4], 6);
  refit_generator_layout_t gl = {.tp = 2, .ep = 2, .engines = 2};
  plan_and_check(&m, &tl, &gl, 1500, &tally);
  assert_int_equal(tally.layouts, 1);

  tl.first_stage_layers = 2; /* 2 + 1 leaves 3 layers for 2 middle stages */
  assert_int_equal(refit_stage_layers(&m, &tl, first), REFIT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(refit_last_error(), "for the other 2 stages of trainer.pp 4"));
}

/* Replicas spread the load: dp 4 trainer ranks feeding one generator rank
 * each send about a quarter (greedy choice; the last pieces bound the
 * imbalance on a model this small). */
static void test_balance(void **state) {
  (void)state;
  refit_model_t m = grid_moe();
  refit_catalog_t *cat;
  refit_plan_t *plan;
  refit_plan_stats_t st;
  refit_trainer_layout_t tl = {.tp = 1, .pp = 1, .ep = 1, .etp = 1, .dp = 4};
  refit_generator_layout_t gl = {.tp = 1, .ep = 1, .engines = 1};
  refit_plan_options_t opt = {.bucket_bytes = 1 << 20, .wire = REFIT_WIRE_BF16};
  assert_int_equal(refit_catalog_create(&m, &tl, &gl, &cat), REFIT_OK);
  assert_int_equal(refit_plan_create(cat, &opt, &plan), REFIT_OK);
  refit_plan_stats(plan, 100.0, &st);
  print_message("egress max/mean %.3f\n", st.egress_max / st.egress_mean);
  assert_true(st.egress_max / st.egress_mean < 1.10);
  assert_true(st.predicted_s > 0);
  refit_plan_destroy(plan);
  refit_catalog_destroy(cat);
}

/* Do the messages (bucket, trainer -> g) and (bucket, trainer -> g0) carry
 * the same chunks of the same source rectangles at the same places? */
static int same_messages(const refit_plan_t *plan, int32_t g, int32_t g0) {
  int64_t matched = 0, of_g = 0;
  for (int64_t i = 0; i < plan->nmsgs; i++) {
    const refit_msg_t *m = &plan->msgs[i];
    if (m->dst_rank != g)
      continue;
    of_g++;
    for (int64_t j = 0; j < plan->nmsgs; j++) {
      const refit_msg_t *n = &plan->msgs[j];
      if (n->dst_rank != g0 || n->bucket != m->bucket || n->src_rank != m->src_rank ||
          n->bytes != m->bytes || n->chunk_count != m->chunk_count)
        continue;
      int same = 1;
      for (int64_t c = 0; c < m->chunk_count && same; c++) {
        const refit_chunk_t *x = &plan->chunks[m->chunk_begin + c];
        const refit_chunk_t *y = &plan->chunks[n->chunk_begin + c];
        same = x->src_tensor == y->src_tensor && x->src_row == y->src_row &&
               x->src_col == y->src_col && x->rows == y->rows && x->cols == y->cols &&
               x->offset - m->offset == y->offset - n->offset;
      }
      matched += same;
      break;
    }
  }
  return of_g > 0 && matched == of_g;
}

/* One model replica on the trainers (dp 1): every engine takes each tensor
 * from the copy the first engine got, so a trainer's messages to the engines
 * are equal bucket by bucket (the session packs them once), and the load
 * stays balanced. With data-parallel replicas the engines spread over them
 * instead. */
static void test_engines_share_sources(void **state) {
  (void)state;
  refit_model_t m = grid_moe();
  const struct {
    refit_trainer_layout_t tl;
    refit_generator_layout_t gl;
    int shared;
  } cases[] = {
      {{.tp = 2, .pp = 1, .ep = 2, .etp = 1, .dp = 1}, {.tp = 1, .ep = 1, .engines = 2}, 1},
      {{.tp = 2, .pp = 2, .ep = 1, .etp = 1, .dp = 1}, {.tp = 2, .ep = 2, .engines = 3}, 1},
      {{.tp = 1, .pp = 1, .ep = 1, .etp = 1, .dp = 2}, {.tp = 1, .ep = 1, .engines = 2}, 0},
  };
  for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
    refit_catalog_t *cat;
    refit_plan_t *plan;
    refit_plan_stats_t st;
    refit_plan_options_t opt = {.bucket_bytes = 4096, .wire = REFIT_WIRE_MXFP8,
                                .chunk_trailer = 8};
    assert_int_equal(refit_catalog_create(&m, &cases[k].tl, &cases[k].gl, &cat), REFIT_OK);
    assert_int_equal(refit_plan_create(cat, &opt, &plan), REFIT_OK);
    const int32_t tp = cases[k].gl.tp;
    for (int32_t g = tp; g < plan->ngenerator; g++)
      assert_int_equal(same_messages(plan, g, g % tp), cases[k].shared);
    refit_plan_stats(plan, 100.0, &st);
    print_message("case %zu: egress max/mean %.3f\n", k, st.egress_max / st.egress_mean);
    assert_true(st.egress_max / st.egress_mean < 1.10);
    refit_plan_destroy(plan);
    refit_catalog_destroy(cat);
  }
}

/* Published Qwen3-30B-A3B: about 30.5 B parameters, 61 GB in BF16. */
static void test_catalog_qwen3_30b(void **state) {
  (void)state;
  refit_model_t m = {.family = REFIT_FAMILY_QWEN3_MOE, .hidden_size = 2048,
                     .num_layers = 48, .num_attention_heads = 32,
                     .num_kv_heads = 4, .head_dim = 128, .vocab_size = 151936,
                     .num_experts = 128, .moe_intermediate_size = 768};
  refit_trainer_layout_t tl = {.tp = 1, .pp = 1, .ep = 1, .etp = 1, .dp = 1};
  refit_generator_layout_t gl = {.tp = 1, .ep = 1, .engines = 1};
  refit_catalog_t *cat;
  assert_int_equal(refit_catalog_create(&m, &tl, &gl, &cat), REFIT_OK);
  int64_t params = 0, gen_params = 0;
  for (int64_t i = 0; i < cat->nsrc; i++)
    params += cat->src[i].rows * cat->src[i].cols;
  for (int64_t i = cat->gen_begin[0]; i < cat->gen_begin[1]; i++)
    gen_params += cat->gen[i].rows * cat->gen[i].cols;
  print_message("qwen3-30b-a3b: %lld parameters\n", (long long)params);
  assert_true(params > 30400000000LL && params < 30600000000LL);
  assert_int_equal(gen_params, params);
  assert_int_equal(cat->nsrc, 3 + 48 * (9 + 3 * 128));
  for (int64_t i = 0; i < cat->nsrc; i++)
    assert_int_equal(refit_catalog_find_src(cat, cat->src[i].name, -1), i);
  assert_int_equal(refit_catalog_find_src(cat, "model.layers.48.mlp.gate.weight", -1), -1);
  refit_catalog_destroy(cat);
}

static void test_bucket_too_small(void **state) {
  (void)state;
  refit_model_t m = grid_moe();
  refit_catalog_t *cat;
  refit_plan_t *plan = NULL;
  refit_trainer_layout_t tl = {.tp = 1, .pp = 1, .ep = 1, .etp = 1, .dp = 1};
  refit_generator_layout_t gl = {.tp = 1, .ep = 1, .engines = 1};
  refit_plan_options_t opt = {.bucket_bytes = 16, .wire = REFIT_WIRE_BF16};
  assert_int_equal(refit_catalog_create(&m, &tl, &gl, &cat), REFIT_OK);
  assert_int_equal(refit_plan_create(cat, &opt, &plan), REFIT_ERR_INVALID_ARGUMENT);
  assert_null(plan);
  assert_non_null(strstr(refit_last_error(), "smaller than one row"));
  refit_catalog_destroy(cat);
}

/* Prequantized wire: quantized tensors travel as K e4m3 + K/32 scale bytes
 * per row, the rest as BF16; buckets still bound staging. */
static void test_wire_mxfp8(void **state) {
  (void)state;
  refit_model_t m = grid_moe();
  refit_catalog_t *cat;
  refit_plan_t *plan;
  refit_trainer_layout_t tl = {.tp = 2, .pp = 1, .ep = 2, .etp = 1, .dp = 1};
  refit_generator_layout_t gl = {.tp = 2, .ep = 1, .engines = 2};
  refit_plan_options_t opt = {.bucket_bytes = 1024, .wire = REFIT_WIRE_MXFP8,
                              .chunk_trailer = 8};
  assert_int_equal(refit_catalog_create(&m, &tl, &gl, &cat), REFIT_OK);
  int64_t expect = 0;
  for (int t = 0; t < gl.tp; t++)
    for (int64_t i = cat->gen_begin[t]; i < cat->gen_begin[t + 1]; i++) {
      refit_gen_tensor_t *g = &cat->gen[i];
      g->quantized = g->kind != REFIT_GEN_PLAIN;
      expect += gl.engines * g->rows *
                (g->quantized ? g->cols + g->cols / 32 : 2 * g->cols);
    }
  assert_int_equal(refit_plan_create(cat, &opt, &plan), REFIT_OK);
  int64_t got = 0;
  for (int64_t i = 0; i < plan->nchunks; i++) {
    const refit_chunk_t *c = &plan->chunks[i];
    const refit_gen_tensor_t *g = &cat->gen[c->dst_tensor];
    assert_int_equal(c->row_bytes, g->quantized ? c->cols + c->cols / 32 : 2 * c->cols);
    got += c->rows * c->row_bytes;
  }
  assert_int_equal(got, expect);
  for (int32_t g = 0; g < plan->ngenerator; g++)
    assert_true(plan->staging[g] <= 1024);
  refit_plan_destroy(plan);
  refit_catalog_destroy(cat);
}

/*
 * Block FP8 wire (refit.prequantize under fp8_block): llama at trainer tp 4
 * -> generator tp 2. o_proj, gate_up_proj and down_proj shards are whole
 * 128 x 128 blocks on every trainer and travel quantized (K e4m3 bytes and a
 * 4-byte slot per 128 columns a row), every chunk of them a rectangle of
 * whole blocks (cut at block rows only) with no assembly area; qkv_proj's k
 * and v pieces are 64 rows a trainer, so qkv_proj travels BF16 and
 * assembles. A bucket smaller than a block row's chunk sends everything
 * BF16; a BF16 wire has no block table.
 */
static void test_wire_fp8_block(void **state) {
  (void)state;
  refit_model_t m = {0};
  m.family = REFIT_FAMILY_LLAMA;
  m.hidden_size = 256;
  m.num_layers = 2;
  m.num_attention_heads = 8;
  m.num_kv_heads = 4;
  m.head_dim = 64;
  m.vocab_size = 512;
  m.intermediate_size = 512;
  refit_catalog_t *cat;
  refit_plan_t *plan;
  refit_trainer_layout_t tl = {.tp = 4, .pp = 1, .ep = 1, .etp = 1, .dp = 1};
  refit_generator_layout_t gl = {.tp = 2, .ep = 1, .engines = 1};
  assert_int_equal(refit_catalog_create(&m, &tl, &gl, &cat), REFIT_OK);
  const int64_t ngen = cat->gen_begin[gl.tp];
  for (int64_t i = 0; i < ngen; i++)
    cat->gen[i].quantized =
        cat->gen[i].kind != REFIT_GEN_PLAIN ? REFIT_QUANT_FP8_BLOCK : REFIT_QUANT_NONE;
  refit_plan_options_t opt = {.bucket_bytes = 48 * 1024, .wire = REFIT_WIRE_FP8_BLOCK,
                              .chunk_trailer = 8};
  assert_int_equal(refit_plan_create(cat, &opt, &plan), REFIT_OK);
  assert_non_null(plan->block_wire);
  int64_t on_trainer = 0;
  for (int64_t i = 0; i < ngen; i++) {
    const refit_gen_tensor_t *g = &cat->gen[i];
    const int fused_kv = strstr(g->name, "qkv_proj") != NULL;
    assert_int_equal(refit_plan_block_prequantized(plan, i), g->quantized && !fused_kv);
    on_trainer += refit_plan_block_prequantized(plan, i);
  }
  assert_int_equal(on_trainer, 12);
  int64_t cut = 0;
  for (int64_t k = 0; k < plan->nchunks; k++) {
    const refit_chunk_t *c = &plan->chunks[k];
    const refit_gen_tensor_t *g = &cat->gen[c->dst_tensor];
    if (!refit_plan_block_prequantized(plan, c->dst_tensor)) {
      assert_int_equal(c->row_bytes, 2 * c->cols);
      continue;
    }
    assert_int_equal(c->row_bytes, c->cols + 4 * ((c->cols + 127) / 128));
    assert_true(refit_plan_chunk_quantized(plan, cat, c));
    refit_block_piece_t *bp = NULL;
    int64_t np = 0;
    assert_int_equal(refit_block_pieces(cat, c->dst_tensor, &bp, &np), REFIT_OK);
    assert_true(
        refit_block_rect_whole(cat, g, bp, np, c->dst_row, c->dst_col, c->rows, c->cols));
    cut += c->rows < 256;
    free(bp);
  }
  assert_true(cut > 0); /* the buckets did cut pieces, at block rows */
  for (int32_t g = 0; g < plan->ngenerator; g++) {
    assert_true(plan->staging[g] <= 48 * 1024);
    const int t = g % gl.tp;
    const int64_t first = cat->gen_begin[t], n = cat->gen_begin[t + 1] - first;
    int64_t *off = malloc((size_t)n * sizeof(*off)), bytes = 0;
    assert_int_equal(refit_plan_assembly(plan, cat, g, off, &bytes), REFIT_OK);
    for (int64_t i = 0; i < n; i++)
      assert_true((off[i] >= 0) == (cat->gen[first + i].quantized &&
                                    !refit_plan_block_prequantized(plan, first + i)));
    free(off);
  }
  refit_plan_destroy(plan);
  /* 16 KiB holds no 128-row chunk of a 256-column tensor: all BF16. */
  opt.bucket_bytes = 16 * 1024;
  assert_int_equal(refit_plan_create(cat, &opt, &plan), REFIT_OK);
  for (int64_t i = 0; i < ngen; i++)
    assert_false(refit_plan_block_prequantized(plan, i));
  refit_plan_destroy(plan);
  opt.wire = REFIT_WIRE_BF16;
  assert_int_equal(refit_plan_create(cat, &opt, &plan), REFIT_OK);
  assert_null(plan->block_wire);
  refit_plan_destroy(plan);
  refit_catalog_destroy(cat);
}

/* Assembly areas (block FP8: its tensors assemble, refit_plan_assembles):
 * in land order, tensors open at the same time never share bytes, every area
 * lies inside the arena, and the land order visits each of the rank's chunks
 * once, bucket by bucket. */
static void test_assembly_areas(void **state) {
  (void)state;
  refit_model_t m = grid_moe();
  m.hidden_size = 128;
  m.moe_intermediate_size = 128;
  refit_catalog_t *cat;
  refit_plan_t *plan;
  refit_trainer_layout_t tl = {.tp = 2, .pp = 1, .ep = 2, .etp = 1, .dp = 1};
  refit_generator_layout_t gl = {.tp = 2, .ep = 2, .engines = 2};
  refit_plan_options_t opt = {.bucket_bytes = 16384, .wire = REFIT_WIRE_BF16,
                              .chunk_trailer = 8};
  assert_int_equal(refit_catalog_create(&m, &tl, &gl, &cat), REFIT_OK);
  for (int64_t i = 0; i < cat->gen_begin[gl.tp]; i++)
    cat->gen[i].quantized =
        cat->gen[i].kind != REFIT_GEN_PLAIN ? REFIT_QUANT_FP8_BLOCK : REFIT_QUANT_NONE;
  assert_int_equal(refit_plan_create(cat, &opt, &plan), REFIT_OK);
  for (int32_t g = 0; g < plan->ngenerator; g++) {
    const int t = g % gl.tp;
    const int64_t first = cat->gen_begin[t], n = cat->gen_begin[t + 1] - first;
    int64_t *off = malloc((size_t)n * sizeof(*off)), bytes = 0, *order, norder;
    int64_t *seen = calloc((size_t)n, sizeof(*seen));
    unsigned char *open = calloc((size_t)n, 1);
    assert_int_equal(refit_plan_assembly(plan, cat, g, off, &bytes), REFIT_OK);
    assert_int_equal(refit_plan_land_order(plan, g, &order, &norder), REFIT_OK);
    int64_t mine = 0;
    for (int64_t c = 0; c < plan->nchunks; c++)
      mine += plan->chunks[c].dst_rank == g;
    assert_int_equal(norder, mine);
    for (int64_t k = 0; k < norder; k++) {
      const refit_chunk_t *c = &plan->chunks[order[k]];
      assert_int_equal(c->dst_rank, g);
      if (k > 0)
        assert_true(plan->chunks[order[k - 1]].bucket <= c->bucket);
      const int64_t i = c->dst_tensor - first;
      const refit_gen_tensor_t *gt = &cat->gen[c->dst_tensor];
      if (!gt->quantized)
        continue;
      const int64_t len = refit_plan_assembly_bytes(gt);
      assert_true(off[i] >= 0 && off[i] + len <= bytes);
      if (seen[i] == 0) {
        for (int64_t j = 0; j < n; j++)
          if (open[j]) {
            const int64_t lj = refit_plan_assembly_bytes(&cat->gen[first + j]);
            if (!(off[i] + len <= off[j] || off[j] + lj <= off[i]))
              fail_msg("rank %d: %s and %s share assembly bytes", g, gt->name,
                       cat->gen[first + j].name);
          }
        open[i] = 1;
      }
      seen[i] += c->rows * c->cols;
      if (seen[i] == gt->elements)
        open[i] = 0;
    }
    for (int64_t i = 0; i < n; i++)
      if (cat->gen[first + i].quantized)
        assert_int_equal(seen[i], cat->gen[first + i].rows * cat->gen[first + i].cols);
    free(off);
    free(seen);
    free(open);
    free(order);
  }
  refit_plan_destroy(plan);
  refit_catalog_destroy(cat);
}


/* The schedule keeps every link busy: over pipeline, expert and data
 * parallel layouts and several engines, every bucket's busiest rank is
 * within 1.2x of its share, so the prediction is within 1.2x of the floor,
 * and no trainer's share of a bucket is much above its share of the refit. */
static void test_bucket_balance(void **state) {
  (void)state;
  refit_model_t m = grid_moe();
  m.num_layers = 8;
  m.hidden_size = 256;
  m.moe_intermediate_size = 128;
  m.vocab_size = 512;
  const struct {
    refit_trainer_layout_t tl;
    refit_generator_layout_t gl;
  } cases[] = {
      {{.tp = 2, .pp = 4, .ep = 2, .etp = 1, .dp = 1}, {.tp = 2, .ep = 2, .engines = 2}},
      {{.tp = 2, .pp = 2, .ep = 4, .etp = 1, .dp = 2}, {.tp = 4, .ep = 4, .engines = 1}},
      {{.tp = 1, .pp = 4, .ep = 1, .etp = 1, .dp = 2}, {.tp = 1, .ep = 1, .engines = 4}},
      {{.tp = 4, .pp = 2, .ep = 2, .etp = 2, .dp = 1}, {.tp = 2, .ep = 1, .engines = 3}},
  };
  for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
    refit_catalog_t *cat;
    refit_plan_t *plan;
    refit_plan_stats_t st;
    refit_plan_options_t opt = {.bucket_bytes = 64 << 10, .wire = REFIT_WIRE_BF16,
                                .chunk_trailer = 8};
    assert_int_equal(refit_catalog_create(&m, &cases[k].tl, &cases[k].gl, &cat), REFIT_OK);
    assert_int_equal(refit_plan_create(cat, &opt, &plan), REFIT_OK);
    check_plan(cat, plan, opt.bucket_bytes);
    refit_plan_stats(plan, 100.0, &st);
    print_message("case %zu: %d buckets, predicted / floor %.3f, worst bucket "
                  "egress %.3f (whole refit %.3f), ingress %.3f\n",
                  k, plan->nbuckets, st.predicted_s / st.floor_s,
                  st.bucket_egress_imbalance, st.egress_max / st.egress_mean,
                  st.bucket_ingress_imbalance);
    assert_true(plan->nbuckets >= 4);
    assert_true(st.predicted_s <= 1.2 * st.floor_s);
    /* A bucket's trainer balance is the whole refit's, no worse. */
    assert_true(st.bucket_egress_imbalance <= 1.2 * st.egress_max / st.egress_mean);
    assert_true(st.bucket_ingress_imbalance <= 1.2);
    refit_plan_destroy(plan);
    refit_catalog_destroy(cat);
  }
}

/* NVLink inside a node: pairs on one node are predicted at its speed; with
 * every pair on one node and NVLink 10x the NIC the prediction is a tenth. */
static void test_predict_nodes(void **state) {
  (void)state;
  refit_model_t m = grid_moe();
  refit_catalog_t *cat;
  refit_plan_t *plan;
  refit_plan_stats_t nic, nvl;
  refit_trainer_layout_t tl = {.tp = 2, .pp = 1, .ep = 2, .etp = 1, .dp = 1};
  refit_generator_layout_t gl = {.tp = 2, .ep = 2, .engines = 1};
  refit_plan_options_t opt = {.bucket_bytes = 4096, .wire = REFIT_WIRE_BF16};
  assert_int_equal(refit_catalog_create(&m, &tl, &gl, &cat), REFIT_OK);
  assert_int_equal(refit_plan_create(cat, &opt, &plan), REFIT_OK);
  refit_plan_network_t net = {.link_gbps = 10, .nvlink_gbps = 100, .gpus_per_node = 0};
  refit_plan_predict(plan, &net, &nic);
  net.gpus_per_node = 4;
  refit_plan_predict(plan, &net, &nvl);
  assert_true(nic.predicted_s > 0 && nic.floor_s > 0);
  assert_true(fabs(nvl.predicted_s * 10 - nic.predicted_s) < 1e-9 * nic.predicted_s + 1e-15);
  assert_true(fabs(nvl.floor_s * 10 - nic.floor_s) < 1e-9 * nic.floor_s + 1e-15);
  refit_plan_destroy(plan);
  refit_catalog_destroy(cat);
}

/* The arena (block FP8): the plan's per-rank arena is refit_plan_assembly's;
 * spread over all trainers it is larger than in tensor order; a bound
 * between them narrows the spread and holds; a bound below tensor order's
 * is refused naming refit.arena_bytes. MXFP8 lands in the runtime layout:
 * its arena is 0 and the spread stays 1 under the smallest bound. */
static void test_arena_bound(void **state) {
  (void)state;
  refit_model_t m = grid_moe();
  m.num_layers = 8;
  m.hidden_size = 128;
  m.moe_intermediate_size = 128;
  refit_catalog_t *cat;
  refit_trainer_layout_t tl = {.tp = 2, .pp = 4, .ep = 2, .etp = 1, .dp = 1};
  refit_generator_layout_t gl = {.tp = 2, .ep = 2, .engines = 2};
  assert_int_equal(refit_catalog_create(&m, &tl, &gl, &cat), REFIT_OK);
  for (int64_t i = 0; i < cat->gen_begin[gl.tp]; i++)
    cat->gen[i].quantized = cat->gen[i].kind != REFIT_GEN_PLAIN ? REFIT_QUANT_MXFP8 : 0;
  for (int w = 0; w < 2; w++) { /* MXFP8 quantized on the generator, then prequantized */
    refit_plan_t *plan = NULL;
    refit_plan_options_t opt = {.bucket_bytes = 16384,
                                .wire = w ? REFIT_WIRE_MXFP8 : REFIT_WIRE_BF16,
                                .chunk_trailer = 8, .arena_bytes = 1};
    assert_int_equal(refit_plan_create(cat, &opt, &plan), REFIT_OK);
    assert_true(plan->spread == 1.0);
    for (int32_t g = 0; g < plan->ngenerator; g++)
      assert_int_equal(plan->arena[g], 0);
    refit_plan_destroy(plan);
  }
  for (int64_t i = 0; i < cat->gen_begin[gl.tp]; i++)
    cat->gen[i].quantized =
        cat->gen[i].kind != REFIT_GEN_PLAIN ? REFIT_QUANT_FP8_BLOCK : REFIT_QUANT_NONE;
  int64_t spread_arena = 0, bound_arena = 0;
  const uint64_t bounds[] = {0, 0, 1};
  for (int k = 0; k < 3; k++) {
    refit_plan_t *plan = NULL;
    refit_plan_options_t opt = {.bucket_bytes = 16384, .wire = REFIT_WIRE_BF16,
                                .chunk_trailer = 8, .arena_bytes = bounds[k]};
    if (k == 1)
      opt.arena_bytes = (uint64_t)spread_arena * 2 / 3;
    if (k == 2) {
      assert_int_equal(refit_plan_create(cat, &opt, &plan), REFIT_ERR_INVALID_ARGUMENT);
      assert_null(plan);
      assert_non_null(strstr(refit_last_error(), "refit.arena_bytes"));
      break;
    }
    assert_int_equal(refit_plan_create(cat, &opt, &plan), REFIT_OK);
    int64_t most = 0;
    for (int32_t g = 0; g < plan->ngenerator; g++) {
      const int64_t n = cat->gen_begin[g % gl.tp + 1] - cat->gen_begin[g % gl.tp];
      int64_t *off = malloc((size_t)n * sizeof(*off)), bytes = 0;
      assert_int_equal(refit_plan_assembly(plan, cat, g, off, &bytes), REFIT_OK);
      assert_int_equal(bytes, plan->arena[g]);
      if (bytes > most)
        most = bytes;
      free(off);
    }
    if (k == 0) {
      spread_arena = most;
      assert_true(plan->spread == 1.0);
    } else {
      bound_arena = most;
      assert_true(most <= (int64_t)opt.arena_bytes);
      assert_true(plan->spread < 1.0);
    }
    print_message("arena bound %llu: spread %.3f, arena %lld\n",
                  (unsigned long long)opt.arena_bytes, plan->spread, (long long)most);
    refit_plan_destroy(plan);
  }
  assert_true(bound_arena > 0 && bound_arena < spread_arena);
  refit_catalog_destroy(cat);
}

/* Row bytes in 64 bits: a row of 2^31 elements (4 GiB of BF16, beyond the
 * config's bounds; the planner gets it directly) is refused against the
 * bucket, not truncated to 0 bytes (a division by zero before). */
static void test_huge_rows(void **state) {
  (void)state;
  refit_model_t m = grid_moe();
  m.hidden_size = INT64_C(1) << 31;
  refit_catalog_t *cat = NULL;
  refit_plan_t *plan = NULL;
  refit_trainer_layout_t tl = {.tp = 1, .pp = 1, .ep = 1, .etp = 1, .dp = 1};
  refit_generator_layout_t gl = {.tp = 1, .ep = 1, .engines = 1};
  refit_plan_options_t opt = {.bucket_bytes = UINT64_C(1) << 30, .wire = REFIT_WIRE_BF16};
  assert_int_equal(refit_catalog_create(&m, &tl, &gl, &cat), REFIT_OK);
  assert_int_equal(refit_plan_create(cat, &opt, &plan), REFIT_ERR_INVALID_ARGUMENT);
  assert_null(plan);
  assert_non_null(strstr(refit_last_error(), "smaller than one row"));
  /* With a bucket that holds the row, it plans, every count in 64 bits. */
  opt.bucket_bytes = UINT64_C(1) << 40;
  m.num_layers = 1;
  m.num_experts = 2;
  m.moe_intermediate_size = 32;
  m.vocab_size = 64;
  refit_catalog_destroy(cat);
  assert_int_equal(refit_catalog_create(&m, &tl, &gl, &cat), REFIT_OK);
  assert_int_equal(refit_plan_create(cat, &opt, &plan), REFIT_OK);
  int64_t widest = 0;
  for (int64_t i = 0; i < plan->nchunks; i++)
    if (plan->chunks[i].row_bytes > widest)
      widest = plan->chunks[i].row_bytes;
  assert_true(widest >= INT64_C(1) << 32);
  refit_plan_destroy(plan);
  refit_catalog_destroy(cat);
}

static void test_layout_rules(void **state) {
  (void)state;
  refit_model_t m = grid_moe();
  refit_catalog_t *cat = NULL;
  refit_trainer_layout_t tl = {.tp = 1, .pp = 1, .ep = 3, .etp = 1, .dp = 3};
  refit_generator_layout_t gl = {.tp = 2, .ep = 2, .engines = 1};
  assert_int_equal(refit_catalog_create(&m, &tl, &gl, &cat),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_non_null(
      strstr(refit_last_error(), "trainer.ep: 3 does not divide model.num_experts"));
  tl.ep = 1;
  tl.dp = 1;
  gl.ep = 4;
  assert_int_equal(refit_catalog_create(&m, &tl, &gl, &cat),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_non_null(
      strstr(refit_last_error(), "generator.ep: expected 1 or generator.tp (2), got 4"));
  assert_null(cat);
}

/* test_plan [--only NAME | --skip NAME]: cmocka's test filters, so that
 * ctest runs the long MoE grid sweep beside the other tests
 * (tests/reshard/CMakeLists.txt). */
int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--only") == 0) {
    cmocka_set_test_filter(argv[2]);
  } else if (argc == 3 && strcmp(argv[1], "--skip") == 0) {
    cmocka_set_skip_filter(argv[2]);
  } else if (argc != 1) {
    fprintf(stderr, "usage: test_plan [--only NAME | --skip NAME]\n");
    return 2;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_catalog_qwen3_30b),
      cmocka_unit_test(test_grid_deepseek),
      cmocka_unit_test(test_huge_rows),
      cmocka_unit_test(test_bucket_balance),
      cmocka_unit_test(test_predict_nodes),
      cmocka_unit_test(test_arena_bound),
      cmocka_unit_test(test_layout_rules),
      cmocka_unit_test(test_bucket_too_small),
      cmocka_unit_test(test_wire_mxfp8),
      cmocka_unit_test(test_wire_fp8_block),
      cmocka_unit_test(test_assembly_areas),
      cmocka_unit_test(test_balance),
      cmocka_unit_test(test_engines_share_sources),
      cmocka_unit_test(test_uneven_stages),
      cmocka_unit_test(test_kv_replication),
      cmocka_unit_test(test_grid_dense),
      cmocka_unit_test(test_grid_moe),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

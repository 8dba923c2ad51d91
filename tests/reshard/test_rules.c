/*
 * The layout rules (reshard/rules.h): the pipeline split against an
 * independent statement of it, and each rule's verdict and the field it
 * blames. The config tests (tests/runtime/test_config.c) check that the
 * same rules reach a person at the right file:line:col.
 */
/* cmocka needs these first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/error.h"
#include "reshard/catalog.h"
#include "reshard/family.h"
#include "reshard/rules.h"

#include <stdio.h>
#include <string.h>

static refit_model_t moe_model(void) {
  return (refit_model_t){.family = REFIT_FAMILY_QWEN3_MOE,
                         .hidden_size = 256,
                         .num_layers = 4,
                         .num_attention_heads = 8,
                         .num_kv_heads = 4,
                         .head_dim = 32,
                         .vocab_size = 1024,
                         .num_experts = 8,
                         .moe_intermediate_size = 128};
}

static refit_trainer_layout_t trainer_layout(void) {
  return (refit_trainer_layout_t){.tp = 2, .pp = 1, .ep = 2, .etp = 1, .dp = 1};
}

static const refit_generator_layout_t gen2 = {.tp = 2, .ep = 2, .engines = 1};

/* The rules' verdict: the one violation expected, or none (field NONE). */
static void expect_rules(const refit_model_t *m, const refit_trainer_layout_t *t,
                         const refit_generator_layout_t *g, refit_fields_t unknown,
                         refit_field_t field, refit_field_t or_field, const char *text) {
  refit_violations_t v;
  refit_layout_rules(m, t, g, unknown, &v);
  if (field == REFIT_FIELD_NONE) {
    if (v.count != 0)
      fail_msg("expected no violation, got %d, first '%s'", v.count, v.v[0].text);
    return;
  }
  if (v.count != 1)
    fail_msg("expected one violation ('%s'), got %d%s%s", text, v.count,
             v.count ? ", first " : "", v.count ? v.v[0].text : "");
  if (v.v[0].field != field || v.v[0].or_field != or_field)
    fail_msg("'%s' blames %s (or %s), want %s (or %s)", v.v[0].text,
             refit_field_name(v.v[0].field), refit_field_name(v.v[0].or_field),
             refit_field_name(field), refit_field_name(or_field));
  if (strstr(v.v[0].text, text) == NULL)
    fail_msg("expected '%s' in '%s'", text, v.v[0].text);
}

/* Every field has a distinct name (config_rules.c finds its key by it), its
 * value is read from the right member, and a family of its own only where
 * one family's models alone have it. */
static void test_field_names(void **state) {
  (void)state;
  refit_model_t m = moe_model();
  refit_trainer_layout_t t = trainer_layout();
  assert_string_equal(refit_field_name(REFIT_FIELD_NONE), "");
  assert_string_equal(refit_field_name(REFIT_FIELD_COUNT), "");
  for (int a = REFIT_FIELD_NONE + 1; a < REFIT_FIELD_COUNT; a++) {
    assert_true(strchr(refit_field_name((refit_field_t)a), '.') != NULL);
    for (int b = a + 1; b < REFIT_FIELD_COUNT; b++)
      assert_string_not_equal(refit_field_name((refit_field_t)a),
                              refit_field_name((refit_field_t)b));
  }
  assert_int_equal(refit_field_value(&m, &t, &gen2, REFIT_FIELD_MODEL_NUM_EXPERTS), 8);
  assert_int_equal(refit_field_value(&m, &t, &gen2, REFIT_FIELD_TRAINER_EP), 2);
  assert_int_equal(refit_field_value(&m, &t, &gen2, REFIT_FIELD_GENERATOR_ENGINES), 1);
  /* Only the MLP's and MLA's dimensions belong to some families: the dense
   * MLP's width to qwen3, llama, qwen2 and deepseek_v3 (its dense first
   * layers), the experts to qwen3_moe and deepseek_v3, MLA and DeepSeek's
   * MoE layout to deepseek_v3 alone. */
  for (int f = REFIT_FIELD_NONE + 1; f < REFIT_FIELD_COUNT; f++) {
    const int dense = f == REFIT_FIELD_MODEL_INTERMEDIATE_SIZE;
    const int moe = f == REFIT_FIELD_MODEL_NUM_EXPERTS ||
                    f == REFIT_FIELD_MODEL_MOE_INTERMEDIATE_SIZE;
    const int deepseek =
        f == REFIT_FIELD_MODEL_Q_LORA_RANK || f == REFIT_FIELD_MODEL_KV_LORA_RANK ||
        f == REFIT_FIELD_MODEL_QK_NOPE_HEAD_DIM || f == REFIT_FIELD_MODEL_V_HEAD_DIM ||
        f == REFIT_FIELD_MODEL_NUM_SHARED_EXPERTS ||
        f == REFIT_FIELD_MODEL_FIRST_K_DENSE_REPLACE ||
        f == REFIT_FIELD_MODEL_MOE_LAYER_FREQ || f == REFIT_FIELD_MODEL_EXPERT_BIAS;
    const int only = moe || deepseek;
    assert_int_equal(refit_field_family_specific((refit_field_t)f), dense || only);
    assert_int_equal(refit_field_in_family((refit_field_t)f, REFIT_FAMILY_QWEN3), !only);
    assert_int_equal(refit_field_in_family((refit_field_t)f, REFIT_FAMILY_LLAMA), !only);
    assert_int_equal(refit_field_in_family((refit_field_t)f, REFIT_FAMILY_QWEN2), !only);
    assert_int_equal(refit_field_in_family((refit_field_t)f, REFIT_FAMILY_QWEN3_MOE),
                     !dense && !deepseek);
    assert_int_equal(refit_field_in_family((refit_field_t)f, REFIT_FAMILY_DEEPSEEK_V3),
                     1);
  }
}

/* The pipeline split, stated independently: stage sizes are the given
 * first / last counts and one common size x >= 1 for every other stage, and
 * they add up to L; with one stage, a given count must be all of L. */
static int split_exists(int64_t L, int pp, int64_t f, int64_t l) {
  if (pp == 1)
    return (f == 0 || f == L) && (l == 0 || l == L);
  const int others = pp - (f != 0) - (l != 0);
  if (others == 0)
    return f + l == L;
  for (int64_t x = 1; x <= L; x++)
    if (f + l + others * x == L)
      return 1;
  return 0;
}

static void test_stage_split(void **state) {
  (void)state;
  int64_t checked = 0;
  for (int64_t L = 1; L <= 12; L++)
    for (int pp = 1; pp <= 6; pp++)
      for (int64_t f = 0; f <= L + 1; f++)
        for (int64_t l = 0; l <= L + 1; l++) {
          refit_model_t m = moe_model();
          refit_trainer_layout_t t = trainer_layout();
          m.num_layers = L;
          t.pp = pp;
          t.first_stage_layers = f;
          t.last_stage_layers = l;
          int64_t first[8];
          const int want = f <= L && l <= L && split_exists(L, pp, f, l);
          const refit_status_t st = refit_stage_layers(&m, &t, first);
          if ((st == REFIT_OK) != want)
            fail_msg("L %lld pp %d first %lld last %lld: %s, want %s (%s)", (long long)L,
                     pp, (long long)f, (long long)l, st == REFIT_OK ? "ok" : "refused",
                     want ? "ok" : "refused", st == REFIT_OK ? "" : refit_last_error());
          /* The layout rules say the same, blaming a pipeline field. */
          refit_violations_t v;
          refit_layout_rules(&m, &t, &gen2, 0, &v);
          int stage_violations = 0;
          for (int i = 0; i < v.count; i++)
            stage_violations += v.v[i].field == REFIT_FIELD_TRAINER_PP ||
                                v.v[i].field == REFIT_FIELD_TRAINER_FIRST_STAGE_LAYERS ||
                                v.v[i].field == REFIT_FIELD_TRAINER_LAST_STAGE_LAYERS;
          assert_int_equal(stage_violations, !want);
          checked++;
          if (!want)
            continue;
          assert_int_equal(first[0], 0);
          assert_int_equal(first[pp], L);
          for (int s = 0; s < pp; s++)
            assert_true(first[s + 1] - first[s] >= 1);
          if (f && pp > 1)
            assert_int_equal(first[1], f);
          if (l && pp > 1)
            assert_int_equal(first[pp] - first[pp - 1], l);
        }
  assert_true(checked > 1000);
}

/* Each rule blames the field a person would change. */
static void test_rules_blame(void **state) {
  (void)state;
  const refit_model_t base = moe_model();
  const refit_trainer_layout_t tb = trainer_layout();
  refit_model_t m = base;
  refit_trainer_layout_t t = tb;
  refit_generator_layout_t g = gen2;

  expect_rules(&m, &t, &g, 0, REFIT_FIELD_NONE, REFIT_FIELD_NONE, NULL);
  /* tp 3 splits neither the heads, the vocabulary nor the KV heads. */
  t.tp = 3;
  t.ep = 1;
  refit_violations_t v;
  refit_layout_rules(&m, &t, &g, 0, &v);
  assert_int_equal(v.count, 3);
  for (int i = 0; i < v.count; i++)
    assert_int_equal(v.v[i].field, REFIT_FIELD_TRAINER_TP);
  assert_string_equal(v.v[0].text, "trainer.tp: 3 does not divide "
                                   "model.num_attention_heads 8 (query heads "
                                   "are split over tp)");
  /* ... not checked when tp is already known to be bad. */
  expect_rules(&m, &t, &g, REFIT_FIELD_BIT(REFIT_FIELD_TRAINER_TP), REFIT_FIELD_NONE,
               REFIT_FIELD_NONE, NULL);

  /* The vocabulary: Hugging Face names split it as it is, Megatron pads
   * it, vLLM pads it to 64. */
  t = tb;
  m.vocab_size = 1025;
  expect_rules(&m, &t, &g, 0, REFIT_FIELD_TRAINER_TP, REFIT_FIELD_NONE,
               "trainer.tp: 2 does not divide model.vocab_size 1025");
  t.names = REFIT_TRAINER_NAMES_MEGATRON;
  expect_rules(&m, &t, &g, 0, REFIT_FIELD_NONE, REFIT_FIELD_NONE, NULL);
  m.vocab_size = 1000;
  g.tp = g.ep = 8; /* 1024 / 8 */
  t.tp = 1;
  t.ep = 1;
  m.num_kv_heads = 8;
  expect_rules(&m, &t, &g, 0, REFIT_FIELD_NONE, REFIT_FIELD_NONE, NULL);
  g.tp = g.ep = 3;
  m.num_attention_heads = m.num_kv_heads = 24;
  m.num_experts = 24;
  expect_rules(&m, &t, &g, 0, REFIT_FIELD_GENERATOR_TP, REFIT_FIELD_NONE,
               "generator.tp: 3 does not divide model.vocab_size 1000 padded to a "
               "multiple of 64 = 1024");

  /* Expert parallelism folds into tp*dp: blame ep, or etp when only it was
   * given. */
  m = base;
  t = tb;
  g = gen2;
  t.ep = 4;
  expect_rules(&m, &t, &g, 0, REFIT_FIELD_TRAINER_EP, REFIT_FIELD_TRAINER_ETP,
               "trainer.etp * trainer.ep = 1 * 4 = 4 does not divide trainer.tp * "
               "trainer.dp = 2 * 1 = 2");
  t = tb;
  g.ep = 1;
  g.tp = 4;
  m.num_attention_heads = 16;
  m.num_kv_heads = 8;
  m.moe_intermediate_size = 129;
  t.etp = 2;
  t.ep = 1;
  refit_layout_rules(&m, &t, &g, 0, &v);
  assert_int_equal(v.count, 2);
  assert_int_equal(v.v[0].field, REFIT_FIELD_TRAINER_ETP);
  assert_int_equal(v.v[1].field, REFIT_FIELD_GENERATOR_TP);
  g.ep = 2;
  expect_rules(&m, &t, &g, REFIT_FIELD_BIT(REFIT_FIELD_MODEL_MOE_INTERMEDIATE_SIZE),
               REFIT_FIELD_GENERATOR_EP, REFIT_FIELD_NONE,
               "generator.ep: expected 1 or generator.tp (4), got 2");

  /* The family's dimensions: blame the dimension, or the family when the
   * dimension was not given; a dense model has no expert parallelism. */
  m = base;
  t = tb;
  g = gen2;
  m.moe_intermediate_size = 0;
  expect_rules(&m, &t, &g, 0, REFIT_FIELD_MODEL_MOE_INTERMEDIATE_SIZE,
               REFIT_FIELD_MODEL_FAMILY,
               "model.moe_intermediate_size: a positive value is required when "
               "model.family is qwen3_moe");
  m = base;
  m.family = REFIT_FAMILY_QWEN3;
  m.intermediate_size = 512;
  t.ep = 1;
  expect_rules(&m, &t, &g, 0, REFIT_FIELD_GENERATOR_EP, REFIT_FIELD_NONE,
               "generator.ep: 2 needs experts, but model.family is qwen3");

  /* Megatron-Core's local spec has no grouped experts. */
  m = base;
  t = tb;
  g = gen2;
  t.names = REFIT_TRAINER_NAMES_MEGATRON;
  t.spec = REFIT_SPEC_LOCAL;
  t.experts = REFIT_EXPERTS_GROUPED;
  expect_rules(&m, &t, &g, 0, REFIT_FIELD_TRAINER_EXPERTS, REFIT_FIELD_NONE,
               "trainer.experts: grouped needs trainer.spec te");

  /* Sizes below 1 are refused once, and nothing divides by them. */
  t = tb;
  m.num_kv_heads = 0;
  t.dp = 0;
  refit_layout_rules(&m, &t, &g, 0, &v);
  assert_int_equal(v.count, 2);
  assert_string_equal(v.v[0].text, "model.num_kv_heads: 0 must be positive");
  assert_string_equal(v.v[1].text, "trainer.dp: 0 must be positive");
}

/* The catalog refuses a layout by the same rules, with the same words. */
static void test_catalog_refuses(void **state) {
  (void)state;
  refit_model_t m = moe_model();
  refit_trainer_layout_t t = trainer_layout();
  refit_catalog_t *cat = NULL;
  t.tp = 3;
  t.ep = 3;
  assert_int_equal(refit_catalog_create(&m, &t, &gen2, &cat), REFIT_ERR_INVALID_ARGUMENT);
  assert_null(cat);
  assert_non_null(strstr(refit_last_error(),
                         "layout: trainer.tp: 3 does not divide "
                         "model.num_attention_heads 8 (query heads are split over "
                         "tp) (and other broken layout rules)"));
  t = trainer_layout();
  t.pp = 65;
  m.num_layers = 65;
  assert_int_equal(refit_catalog_create(&m, &t, &gen2, &cat), REFIT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(refit_last_error(), "at most 64 stages"));
}

/* DeepSeek-V3's rules: its MLA and MoE dimensions, num_kv_heads = heads,
 * the shared experts and the dense layers split by tp, the local spec's
 * row-split down projections. */
static void test_deepseek_rules(void **state) {
  (void)state;
  const refit_model_t ds = {.family = REFIT_FAMILY_DEEPSEEK_V3,
                            .hidden_size = 128,
                            .num_layers = 3,
                            .num_attention_heads = 4,
                            .num_kv_heads = 4,
                            .head_dim = 32,
                            .vocab_size = 512,
                            .intermediate_size = 256,
                            .num_experts = 8,
                            .moe_intermediate_size = 64,
                            .q_lora_rank = 64,
                            .kv_lora_rank = 64,
                            .qk_nope_head_dim = 32,
                            .v_head_dim = 32,
                            .num_shared_experts = 1,
                            .first_k_dense_replace = 1};
  const refit_trainer_layout_t t = trainer_layout();
  refit_model_t m = ds;
  expect_rules(&m, &t, &gen2, 0, REFIT_FIELD_NONE, REFIT_FIELD_NONE, NULL);
  /* Layers 0 dense, 1 and 2 MoE; moe_layer_freq 2 makes 1 dense too. */
  assert_false(refit_layer_is_moe(&m, 0));
  assert_true(refit_layer_is_moe(&m, 1));
  m.moe_layer_freq = 2;
  assert_false(refit_layer_is_moe(&m, 1));
  assert_true(refit_layer_is_moe(&m, 2));
  m = ds;
  m.num_kv_heads = 2;
  expect_rules(&m, &t, &gen2, 0, REFIT_FIELD_MODEL_NUM_KV_HEADS, REFIT_FIELD_NONE,
               "model.num_kv_heads: expected model.num_attention_heads (4) for "
               "model.family deepseek_v3, got 2");
  m = ds;
  m.kv_lora_rank = 0;
  expect_rules(&m, &t, &gen2, 0, REFIT_FIELD_MODEL_KV_LORA_RANK, REFIT_FIELD_MODEL_FAMILY,
               "model.kv_lora_rank: a positive value is required when model.family is "
               "deepseek_v3");
  m = ds;
  m.q_lora_rank = 0; /* V2-Lite: q_proj */
  expect_rules(&m, &t, &gen2, 0, REFIT_FIELD_NONE, REFIT_FIELD_NONE, NULL);
  m = ds;
  m.num_shared_experts = 3;
  m.moe_intermediate_size = 34; /* 102 shared rows split over tp 2, not 4 */
  const refit_generator_layout_t gen4 = {.tp = 4, .ep = 4, .engines = 1};
  expect_rules(&m, &t, &gen4, 0, REFIT_FIELD_GENERATOR_TP, REFIT_FIELD_NONE,
               "generator.tp: 4 does not divide model.num_shared_experts * "
               "model.moe_intermediate_size = 102");
  /* The local spec splits the down projections by rows over tp. */
  m = ds;
  m.q_lora_rank = 48;
  refit_trainer_layout_t local = t;
  local.names = REFIT_TRAINER_NAMES_MEGATRON;
  local.spec = REFIT_SPEC_LOCAL;
  local.tp = 4;
  local.ep = 4;
  expect_rules(&m, &t, &gen2, 0, REFIT_FIELD_NONE, REFIT_FIELD_NONE, NULL);
  m.q_lora_rank = 50;
  expect_rules(&m, &local, &gen2, 0, REFIT_FIELD_TRAINER_TP, REFIT_FIELD_NONE,
               "trainer.tp: 4 does not divide model.q_lora_rank = 50");
}

/* The multi-token-prediction layer: skipped by name for deepseek_v3 (under
 * either naming, after the wrapper's prefix), never for another family or
 * a name that only looks alike. */
static void test_mtp_skipped(void **state) {
  (void)state;
  refit_model_t m = {.family = REFIT_FAMILY_DEEPSEEK_V3, .num_layers = 61};
  refit_trainer_layout_t t = trainer_layout();
  assert_non_null(refit_family_skipped(&m, &t, "model.layers.61.enorm.weight"));
  assert_non_null(refit_family_skipped(&m, &t, "model.layers.61.mlp.experts.3.w1.weight"));
  assert_null(refit_family_skipped(&m, &t, "model.layers.60.mlp.gate.weight"));
  assert_null(refit_family_skipped(&m, &t, "model.layers.x1.enorm.weight"));
  assert_null(refit_family_skipped(&m, &t, "model.layers.-62.enorm.weight"));
  assert_non_null(refit_family_skipped(&m, &t, "mtp.layers.0.eh_proj.weight"));
  snprintf(t.name_prefix, sizeof(t.name_prefix), "module.module.");
  assert_non_null(refit_family_skipped(&m, &t, "module.module.mtp.layers.0.hnorm.weight"));
  assert_null(refit_family_skipped(&m, &t, "module.mtp.layers.0.hnorm.weight"));
  assert_null(refit_family_skipped(&m, &t, "mtpx.layers.0.hnorm.weight"));
  m.family = REFIT_FAMILY_QWEN3_MOE;
  assert_null(refit_family_skipped(&m, &t, "model.layers.61.enorm.weight"));
  assert_null(refit_family_skipped(&m, &t, "module.module.mtp.layers.0.hnorm.weight"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_field_names),    cmocka_unit_test(test_stage_split),
      cmocka_unit_test(test_rules_blame),    cmocka_unit_test(test_catalog_refuses),
      cmocka_unit_test(test_deepseek_rules), cmocka_unit_test(test_mtp_skipped),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

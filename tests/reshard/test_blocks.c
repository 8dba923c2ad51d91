/*
 * Block FP8 pieces and shard rules (reshard/blocks.h): the pieces of fused
 * runtime tensors with their scale rows, the same whichever names the
 * trainer uses (its fused Megatron tensors are traced back to Hugging Face
 * rows), and the shards the rules refuse with the field to blame.
 */
#include "reshard/blocks.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

static refit_model_t dense_model(void) {
  refit_model_t m = {0};
  m.family = REFIT_FAMILY_QWEN3;
  m.hidden_size = 256;
  m.num_layers = 2;
  m.num_attention_heads = 4;
  m.num_kv_heads = 2;
  m.head_dim = 128;
  m.vocab_size = 512;
  m.intermediate_size = 384;
  return m;
}

static int64_t find_gen(const refit_catalog_t *cat, int t, const char *name) {
  for (int64_t i = cat->gen_begin[t]; i < cat->gen_begin[t + 1]; i++)
    if (strcmp(cat->gen[i].name, name) == 0)
      return i;
  fail_msg("no runtime tensor %s on tp rank %d", name, t);
  return -1;
}

typedef struct {
  const char *hf;
  int64_t matrix, row0, rows, hf_row, hf_col, scale_row0;
} want_piece_t;

static void expect_pieces(const refit_catalog_t *cat, int t, const char *tensor,
                          const want_piece_t *want, int64_t n) {
  refit_block_piece_t *p = NULL;
  int64_t np = 0;
  assert_int_equal(refit_block_pieces(cat, find_gen(cat, t, tensor), &p, &np), REFIT_OK);
  assert_int_equal(np, n);
  for (int64_t k = 0; k < n; k++) {
    assert_string_equal(cat->hf[p[k].hf].name, want[k].hf);
    assert_int_equal(p[k].matrix, want[k].matrix);
    assert_int_equal(p[k].row0, want[k].row0);
    assert_int_equal(p[k].rows, want[k].rows);
    assert_int_equal(p[k].hf_row, want[k].hf_row);
    assert_int_equal(p[k].hf_col, want[k].hf_col);
    assert_int_equal(p[k].scale_row0, want[k].scale_row0);
    assert_int_equal(
        refit_block_piece_check(cat, &cat->gen[find_gen(cat, t, tensor)], t, &p[k], NULL),
        REFIT_OK);
  }
  free(p);
}

/* qkv_proj and gate_up_proj at generator tp 1: one piece per Hugging Face
 * tensor, each with its own run of scale rows, from HF-named and from
 * Megatron-named (fused, tp 2) trainer tensors alike. */
static void test_dense_pieces(void **state) {
  (void)state;
  const refit_model_t m = dense_model();
  for (int names = REFIT_TRAINER_NAMES_HF; names <= REFIT_TRAINER_NAMES_MEGATRON;
       names++) {
    refit_trainer_layout_t tl = {.tp = 2,
                                 .pp = 1,
                                 .ep = 1,
                                 .etp = 1,
                                 .dp = 1,
                                 .names = names,
                                 .vocab_divisible_by = 128};
    refit_generator_layout_t gl = {.tp = 1, .ep = 1, .engines = 1};
    refit_catalog_t *cat = NULL;
    assert_int_equal(refit_catalog_create(&m, &tl, &gl, &cat), REFIT_OK);
    const want_piece_t qkv[] = {
        {"model.layers.1.self_attn.q_proj.weight", 0, 0, 512, 0, 0, 0},
        {"model.layers.1.self_attn.k_proj.weight", 0, 512, 256, 0, 0, 4},
        {"model.layers.1.self_attn.v_proj.weight", 0, 768, 256, 0, 0, 6}};
    expect_pieces(cat, 0, "model.layers.1.self_attn.qkv_proj.weight", qkv, 3);
    const want_piece_t gate_up[] = {
        {"model.layers.0.mlp.gate_proj.weight", 0, 0, 384, 0, 0, 0},
        {"model.layers.0.mlp.up_proj.weight", 0, 384, 384, 0, 0, 3}};
    expect_pieces(cat, 0, "model.layers.0.mlp.gate_up_proj.weight", gate_up, 2);
    const refit_gen_tensor_t *g =
        &cat->gen[find_gen(cat, 0, "model.layers.0.mlp.down_proj.weight")];
    assert_int_equal(refit_block_scale_rows(g), 2);
    assert_int_equal(refit_block_scale_cols(g), 3);
    refit_catalog_destroy(cat);
  }
}

/* Experts TP-sharded (generator ep 1): per expert a gate and an up piece of
 * 128 rows, w2's columns shard t, scale rows counted per expert matrix. */
static void test_expert_pieces(void **state) {
  (void)state;
  refit_model_t m = dense_model();
  m.family = REFIT_FAMILY_QWEN3_MOE;
  m.hidden_size = 320; /* partial: ceil(320/128) = 3 scale rows per w2 matrix */
  m.intermediate_size = 0;
  m.num_experts = 2;
  m.moe_intermediate_size = 256;
  refit_trainer_layout_t tl = {.tp = 1,
                               .pp = 1,
                               .ep = 2,
                               .etp = 1,
                               .dp = 2,
                               .names = REFIT_TRAINER_NAMES_MEGATRON,
                               .vocab_divisible_by = 128};
  refit_generator_layout_t gl = {.tp = 2, .ep = 1, .engines = 1};
  refit_catalog_t *cat = NULL;
  assert_int_equal(refit_catalog_create(&m, &tl, &gl, &cat), REFIT_OK);
  const want_piece_t w13[] = {
      {"model.layers.0.mlp.experts.0.gate_proj.weight", 0, 0, 128, 128, 0, 0},
      {"model.layers.0.mlp.experts.0.up_proj.weight", 0, 128, 128, 128, 0, 1},
      {"model.layers.0.mlp.experts.1.gate_proj.weight", 1, 0, 128, 128, 0, 2},
      {"model.layers.0.mlp.experts.1.up_proj.weight", 1, 128, 128, 128, 0, 3}};
  /* Rows of 320 columns end in a partial block: only tp rank 1's shard
   * (the tensor's last rows) holds the padding element. */
  expect_pieces(cat, 1, "model.layers.0.mlp.experts.w13_weight", w13, 4);
  refit_block_piece_t *p = NULL;
  int64_t np = 0;
  const int64_t i2 = find_gen(cat, 0, "model.layers.0.mlp.experts.w2_weight");
  assert_int_equal(refit_block_pieces(cat, i2, &p, &np), REFIT_OK);
  assert_int_equal(np, 2);
  assert_int_equal(p[1].matrix, 1);
  assert_int_equal(p[1].rows, 320);
  assert_int_equal(p[1].hf_col, 0);
  assert_int_equal(p[1].scale_row0, 3);
  assert_int_equal(refit_block_scale_rows(&cat->gen[i2]), 6);
  assert_int_equal(refit_block_scale_cols(&cat->gen[i2]), 1);
  /* Rank 0's w2 columns 0..127 of [320, 256]: partial rows, not the last
   * element. */
  refit_field_t blame = REFIT_FIELD_NONE;
  assert_int_equal(refit_block_piece_check(cat, &cat->gen[i2], 0, &p[0], &blame),
                   REFIT_ERR_CONFIG);
  assert_int_equal(blame, REFIT_FIELD_GENERATOR_TP);
  free(p);
  refit_catalog_destroy(cat);
}

/* vLLM's refusals: KV shards of 64 rows at tp 2 (generator.tp to blame),
 * and experts of 64 rows with whole experts per rank (the model's size). */
static void test_refused(void **state) {
  (void)state;
  refit_model_t m = dense_model();
  m.head_dim = 64;
  refit_trainer_layout_t tl = {
      .tp = 1, .pp = 1, .ep = 1, .etp = 1, .dp = 1, .names = REFIT_TRAINER_NAMES_HF};
  refit_generator_layout_t gl = {.tp = 2, .ep = 1, .engines = 1};
  refit_catalog_t *cat = NULL;
  assert_int_equal(refit_catalog_create(&m, &tl, &gl, &cat), REFIT_OK);
  const int64_t i = find_gen(cat, 1, "model.layers.0.self_attn.qkv_proj.weight");
  refit_block_piece_t *p = NULL;
  int64_t np = 0;
  assert_int_equal(refit_block_pieces(cat, i, &p, &np), REFIT_OK);
  assert_int_equal(np, 3);
  refit_field_t blame = REFIT_FIELD_NONE;
  assert_int_equal(refit_block_piece_check(cat, &cat->gen[i], 1, &p[0], &blame),
                   REFIT_OK);
  assert_int_equal(refit_block_piece_check(cat, &cat->gen[i], 1, &p[1], &blame),
                   REFIT_ERR_CONFIG);
  assert_int_equal(blame, REFIT_FIELD_GENERATOR_TP);
  assert_non_null(
      strstr(refit_last_error(),
             "model.layers.0.self_attn.qkv_proj.weight on generator tp rank 1: "
             "the piece rows 64..127"));
  free(p);
  refit_catalog_destroy(cat);

  m = dense_model();
  m.family = REFIT_FAMILY_QWEN3_MOE;
  m.intermediate_size = 0;
  m.num_experts = 2;
  m.moe_intermediate_size = 64;
  gl.ep = 2;
  assert_int_equal(refit_catalog_create(&m, &tl, &gl, &cat), REFIT_OK);
  const int64_t j = find_gen(cat, 0, "model.layers.0.mlp.experts.w13_weight");
  assert_int_equal(refit_block_pieces(cat, j, &p, &np), REFIT_OK);
  assert_int_equal(refit_block_piece_check(cat, &cat->gen[j], 0, &p[0], &blame),
                   REFIT_ERR_CONFIG);
  assert_int_equal(blame, REFIT_FIELD_MODEL_MOE_INTERMEDIATE_SIZE);
  free(p);
  refit_catalog_destroy(cat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dense_pieces),
      cmocka_unit_test(test_expert_pieces),
      cmocka_unit_test(test_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

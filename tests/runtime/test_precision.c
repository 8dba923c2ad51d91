/*
 * Which runtime tensors are MXFP8 when the engine registers its own
 * (runtime/src/session/precision.h): the reduced votes of every rank flip a tensor
 * to BF16 or to MXFP8, engines that disagree are refused naming the tensor,
 * and a tensor refit cannot quantize (a K that is no multiple of the MXFP8
 * block, which the config never checked because it keeps that module in
 * BF16) is refused naming the rule, changing nothing. The expected flags are
 * stated from the votes, not from the code under test.
 */
#include "config/config.h"
#include "core/error.h"
#include "session/precision.h"
#include "reshard/catalog.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */

/* Dense qwen3 whose down_proj K (intermediate 48) is no multiple of 32:
 * valid only because the config keeps down_proj in BF16. */
static const char dense[] = "model: {family: qwen3, hidden_size: 64, num_layers: 2,\n"
                            "  num_attention_heads: 2, num_kv_heads: 1, head_dim: 32,\n"
                            "  vocab_size: 128, intermediate_size: 48}\n"
                            "trainer: {tp: 1}\n"
                            "generator: {tp: 1, engines: 2}\n"
                            "refit: {precision: mxfp8,\n"
                            "  quantization_ignore: [lm_head, down_proj, "
                            "model.layers.1.self_attn.o_proj]}\n";

static refit_config_t cfg;
static refit_catalog_t *cat;
static int64_t ngen;

static int setup(void **state) {
  (void)state;
  char *errors = NULL;
  if (refit_config_parse(dense, sizeof(dense) - 1, "dense.yaml", 0, &cfg, &errors) != REFIT_OK)
    fail_msg("config: %s", errors ? errors : refit_last_error());
  assert_int_equal(refit_catalog_create(&cfg.model, &cfg.trainer, &cfg.generator, &cat),
                   REFIT_OK);
  refit_config_mark_quantized(&cfg, cat);
  ngen = cat->gen_begin[cat->generator.tp];
  return 0;
}

static int teardown(void **state) {
  (void)state;
  refit_catalog_destroy(cat);
  return 0;
}

static int64_t find(const char *name) {
  for (int64_t i = 0; i < ngen; i++)
    if (strcmp(cat->gen[i].name, name) == 0)
      return i;
  fail_msg("no generator tensor %s", name);
  return -1;
}

static void flags(int *out) {
  for (int64_t i = 0; i < ngen; i++)
    out[i] = cat->gen[i].quantized;
}

static void test_no_votes_no_change(void **state) {
  (void)state;
  int before[256], after[256];
  unsigned char votes[256] = {0};
  assert_true(ngen <= 256);
  flags(before);
  int64_t b = -1, m = -1;
  assert_int_equal(refit_precision_decide(&cfg, cat, votes, &b, &m), REFIT_OK);
  assert_int_equal(b, 0);
  assert_int_equal(m, 0);
  flags(after);
  assert_memory_equal(before, after, sizeof(int) * (size_t)ngen);
}

static void test_flips_both_ways(void **state) {
  (void)state;
  const int64_t qkv = find("model.layers.0.self_attn.qkv_proj.weight");
  const int64_t o1 = find("model.layers.1.self_attn.o_proj.weight");
  assert_true(cat->gen[qkv].quantized);
  assert_false(cat->gen[o1].quantized);
  unsigned char votes[256] = {0};
  for (int64_t i = 0; i < ngen; i++)
    votes[i] = REFIT_FORM_PLANNED;
  votes[qkv] = REFIT_FORM_BF16;                       /* one engine: BF16 */
  votes[o1] = REFIT_FORM_MXFP8;                       /* e4m3 + scale */
  int64_t b = -1, m = -1;
  assert_int_equal(refit_precision_decide(&cfg, cat, votes, &b, &m), REFIT_OK);
  assert_int_equal(b, 1);
  assert_int_equal(m, 1);
  assert_false(cat->gen[qkv].quantized);
  assert_true(cat->gen[o1].quantized);
  /* The same votes again: the flags already follow them. */
  votes[qkv] = REFIT_FORM_PLANNED;
  votes[o1] = REFIT_FORM_PLANNED;
  assert_int_equal(refit_precision_decide(&cfg, cat, votes, &b, &m), REFIT_OK);
  assert_int_equal(b + m, 0);
  cat->gen[qkv].quantized = 1; /* back as the config has it */
  cat->gen[o1].quantized = 0;
}

static void test_engines_disagree(void **state) {
  (void)state;
  const int64_t qkv = find("model.layers.0.self_attn.qkv_proj.weight");
  unsigned char votes[256] = {0};
  votes[qkv] = REFIT_FORM_BF16 | REFIT_FORM_PLANNED; /* BF16 on one, e4m3 on another */
  int64_t b, m;
  assert_int_equal(refit_precision_decide(&cfg, cat, votes, &b, &m),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(refit_last_error(), "model.layers.0.self_attn.qkv_proj.weight"));
  assert_non_null(strstr(refit_last_error(), "both in BF16 and in MXFP8"));
  assert_true(cat->gen[qkv].quantized);
}

static void test_cannot_quantize(void **state) {
  (void)state;
  const int64_t down = find("model.layers.0.mlp.down_proj.weight");
  const int64_t qkv = find("model.layers.0.self_attn.qkv_proj.weight");
  assert_false(cat->gen[down].quantized);
  unsigned char votes[256] = {0};
  votes[down] = REFIT_FORM_MXFP8;
  votes[qkv] = REFIT_FORM_BF16; /* valid, but nothing changes when one fails */
  int64_t b, m;
  assert_int_equal(refit_precision_decide(&cfg, cat, votes, &b, &m),
                   REFIT_ERR_INVALID_ARGUMENT);
  const char *e = refit_last_error();
  if (strstr(e, "down_proj") == NULL || strstr(e, "48") == NULL ||
      strstr(e, "register it in bfloat16") == NULL)
    fail_msg("unexpected message: %s", e);
  assert_false(cat->gen[down].quantized);
  assert_true(cat->gen[qkv].quantized);
}

static void test_plain_is_never_quantized(void **state) {
  (void)state;
  const int64_t norm = find("model.layers.0.input_layernorm.weight");
  assert_int_equal(refit_config_check_quantizable(&cfg, cat, &cat->gen[norm]),
                   REFIT_ERR_CONFIG);
  assert_non_null(strstr(refit_last_error(), "keeps it in bfloat16"));
  const int64_t o1 = find("model.layers.1.self_attn.o_proj.weight");
  assert_int_equal(refit_config_check_quantizable(&cfg, cat, &cat->gen[o1]), REFIT_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_votes_no_change),
      cmocka_unit_test(test_flips_both_ways),
      cmocka_unit_test(test_engines_disagree),
      cmocka_unit_test(test_cannot_quantize),
      cmocka_unit_test(test_plain_is_never_quantized),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

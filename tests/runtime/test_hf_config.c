/*
 * model.hf_config: shapes from a Hugging Face config.json (hf_config.c and
 * its use in config.c). Each case writes a config.json into a fresh
 * directory next to the YAML file that names it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "config/config.h"
#include "config/config_table.h"
#include "config/hf_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];

static const char *moe_json =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\",\n"
    " \"hidden_size\": 128, \"num_hidden_layers\": 4, \"num_attention_heads\": 8,\n"
    " \"num_key_value_heads\": 4, \"head_dim\": 16, \"vocab_size\": 512,\n"
    " \"intermediate_size\": 384, \"num_experts\": 8, \"moe_intermediate_size\": 64,\n"
    " \"decoder_sparse_step\": 1, \"mlp_only_layers\": [], \"attention_bias\": false,\n"
    " \"tie_word_embeddings\": false, \"rope_theta\": 1000000.0}\n";

static const char *layout = "trainer:\n  tp: 2\n  ep: 2\ngenerator:\n  tp: 2\n  ep: 2\n";

static void write_file(const char *name, const char *text) {
  char path[128];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* Parse YAML `model` + the layout as DIR/job.yaml; returns the errors. */
static char *parse(const char *model, refit_status_t want, refit_config_t *cfg) {
  char yaml[4096], name[128];
  char *errors = NULL;
  snprintf(yaml, sizeof(yaml), "%s%s", model, layout);
  snprintf(name, sizeof(name), "%s/job.yaml", dir);
  refit_config_t local;
  refit_status_t st =
      refit_config_parse(yaml, strlen(yaml), name, 0, cfg ? cfg : &local, &errors);
  if (st != want)
    fail_msg("status %d, expected %d; errors:\n%s", st, want, errors ? errors : "");
  return errors;
}

static void expect(char *errors, const char *part) {
  if (errors == NULL || strstr(errors, part) == NULL)
    fail_msg("expected '%s' in the errors:\n%s", part, errors ? errors : "(none)");
}

/* config.json with `from` replaced by `to`. */
static void write_json_edit(const char *from, const char *to) {
  char text[4096];
  const char *p = strstr(moe_json, from);
  assert_non_null(p);
  snprintf(text, sizeof(text), "%.*s%s%s", (int)(p - moe_json), moe_json, to,
           p + strlen(from));
  write_file("config.json", text);
}

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof(dir), "/tmp/refit-hf-XXXXXX");
  assert_non_null(mkdtemp(dir));
  write_file("config.json", moe_json);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char path[128];
  snprintf(path, sizeof(path), "%s/config.json", dir);
  unlink(path);
  rmdir(dir);
  return 0;
}

static void test_shape_from_config_json(void **state) {
  (void)state;
  refit_config_t cfg;
  /* The directory, relative to the YAML file's. */
  char *errors = parse("model:\n  hf_config: .\n", REFIT_OK, &cfg);
  assert_null(errors);
  assert_int_equal(cfg.model.family, REFIT_FAMILY_QWEN3_MOE);
  assert_int_equal(cfg.model.hidden_size, 128);
  assert_int_equal(cfg.model.num_layers, 4);
  assert_int_equal(cfg.model.num_attention_heads, 8);
  assert_int_equal(cfg.model.num_kv_heads, 4);
  assert_int_equal(cfg.model.head_dim, 16);
  assert_int_equal(cfg.model.vocab_size, 512);
  assert_int_equal(cfg.model.num_experts, 8);
  assert_int_equal(cfg.model.moe_intermediate_size, 64);
  /* A MoE model's intermediate_size sizes dense layers only: not read. */
  assert_int_equal(cfg.model.intermediate_size, 0);
  assert_int_equal(cfg.model.tie_word_embeddings, 0);
  assert_string_equal(cfg.hf_config, ".");
  /* The file itself, and keys that agree. */
  errors = parse("model:\n  hf_config: config.json\n  hidden_size: 128\n"
                 "  family: qwen3_moe\n",
                 REFIT_OK, NULL);
  assert_null(errors);
  /* The formatted config reads back (the values agree with the file). */
  char *text = NULL;
  assert_int_equal(refit_config_format(&cfg, &text), REFIT_OK);
  char name[128];
  snprintf(name, sizeof(name), "%s/formatted.yaml", dir);
  refit_config_t back;
  assert_int_equal(refit_config_parse(text, strlen(text), name, 0, &back, &errors),
                   REFIT_OK);
  assert_int_equal(refit_config_hash(&back), refit_config_hash(&cfg));
  free(text);
}

static void test_yaml_must_agree(void **state) {
  (void)state;
  char *errors = parse("model:\n  hf_config: .\n  hidden_size: 256\n  num_experts: 8\n",
                       REFIT_ERR_CONFIG, NULL);
  expect(errors, "job.yaml:3:3: model.hidden_size: 256 disagrees with ");
  expect(errors, "config.json's key 'hidden_size' (128)");
  assert_null(strstr(errors, "num_experts"));
  free(errors);
}

static void test_rule_names_the_file_key(void **state) {
  (void)state;
  write_json_edit("\"num_key_value_heads\": 4", "\"num_key_value_heads\": 3");
  char *errors = parse("model:\n  hf_config: .\n", REFIT_ERR_CONFIG, NULL);
  expect(errors, "job.yaml:2:3: model.num_kv_heads: 3 does not divide");
  expect(errors, "(model.num_kv_heads is ");
  expect(errors, "config.json's key 'num_key_value_heads')");
  free(errors);
}

static void test_unsupported_values(void **state) {
  (void)state;
  static const struct {
    const char *from, *to, *message;
  } cases[] = {
      {"\"Qwen3MoeForCausalLM\"", "\"MixtralForCausalLM\"",
       "architectures: [\"MixtralForCausalLM\"] is not supported; refit reads "
       "Qwen3ForCausalLM, Qwen3MoeForCausalLM, LlamaForCausalLM, Qwen2ForCausalLM or "
       "DeepseekV3ForCausalLM"},
      {"\"model_type\": \"qwen3_moe\"", "\"model_type\": \"qwen3\"",
       "model_type: \"qwen3\" disagrees with architectures Qwen3MoeForCausalLM"},
      {"\"attention_bias\": false", "\"attention_bias\": true",
       "attention_bias: true is not supported"},
      {"\"mlp_only_layers\": []", "\"mlp_only_layers\": [0, 3]",
       "mlp_only_layers: [0,3] makes those layers dense MLP layers inside a MoE model"},
      {"\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 2",
       "decoder_sparse_step: 2 makes layers with (i + 1) % 2 != 0 dense MLP layers"},
      {"\"head_dim\": 16, ", "",
       "key 'head_dim' is missing (model.head_dim reads it "
       "explicitly)"},
      {"\"hidden_size\": 128", "\"hidden_size\": \"128\"",
       "hidden_size: expected an integer from 1 to"},
      {"\"hidden_size\": 128", "\"hidden_size\": 128.5",
       "hidden_size: expected an integer from 1 to"},
      {"\"tie_word_embeddings\": false", "\"tie_word_embeddings\": 0",
       "tie_word_embeddings: expected true or false, got 0"},
      {"\"vocab_size\": 512,", "\"vocab_size\": 512,,", "not valid JSON"},
      {"\"vocab_size\": 512,", "\"vocab_size\": 512, \"vocab_size\": 512,",
       "duplicate object key"},
      {"\"rope_theta\"", "\"rope_\xff\"", "not valid JSON"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    write_json_edit(cases[i].from, cases[i].to);
    char *errors = parse("model:\n  hf_config: .\n", REFIT_ERR_CONFIG, NULL);
    expect(errors, "job.yaml:2:3: model.hf_config: ");
    expect(errors, "/config.json: ");
    expect(errors, cases[i].message);
    /* The model keys the file stands for are not reported missing. */
    assert_null(strstr(errors, "missing required"));
    free(errors);
  }
  /* Every problem at once. */
  write_json_edit("\"attention_bias\": false,\n \"tie_word_embeddings\": false",
                  "\"attention_bias\": true,\n \"tie_word_embeddings\": 1");
  char *errors = parse("model:\n  hf_config: .\n", REFIT_ERR_CONFIG, NULL);
  expect(errors, "attention_bias: true");
  expect(errors, "tie_word_embeddings: expected true or false");
  free(errors);
}

/* A value from config.json meets the bounds of the table row it fills, as
 * the same value in the YAML file would: refused at model.hf_config, naming
 * the file, its key and the row's bound. */
static void test_table_bounds(void **state) {
  (void)state;
  static const struct {
    const char *from, *json_key, *yaml_key;
  } keys[] = {
      {"\"hidden_size\": 128", "hidden_size", "model.hidden_size"},
      {"\"num_hidden_layers\": 4", "num_hidden_layers", "model.num_layers"},
      {"\"num_attention_heads\": 8", "num_attention_heads", "model.num_attention_heads"},
      {"\"num_key_value_heads\": 4", "num_key_value_heads", "model.num_kv_heads"},
      {"\"head_dim\": 16", "head_dim", "model.head_dim"},
      {"\"vocab_size\": 512", "vocab_size", "model.vocab_size"},
      {"\"num_experts\": 8", "num_experts", "model.num_experts"},
      {"\"moe_intermediate_size\": 64", "moe_intermediate_size",
       "model.moe_intermediate_size"},
  };
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
    const int row = refit_config_table_path(&refit_config_table, keys[i].yaml_key);
    assert_true(row >= 0);
    const int64_t max = refit_config_rows[row].max;
    char to[96], message[256];
    snprintf(to, sizeof(to), "\"%s\": %lld", keys[i].json_key, (long long)max + 1);
    write_json_edit(keys[i].from, to);
    char *errors = parse("model:\n  hf_config: .\n", REFIT_ERR_CONFIG, NULL);
    snprintf(message, sizeof(message),
             "/config.json: %s: %lld is beyond %s's bound (expected a %s "
             "integer no larger than %lld)",
             keys[i].json_key, (long long)max + 1, keys[i].yaml_key,
             refit_config_rows[row].min == 1 ? "positive" : "non-negative",
             (long long)max);
    expect(errors, "job.yaml:2:3: model.hf_config: ");
    expect(errors, message);
    assert_null(strstr(errors, "missing required"));
    free(errors);
  }
  /* The case reported: a hidden size eight times the bound. */
  write_json_edit("\"hidden_size\": 128", "\"hidden_size\": 1048576");
  char *errors = parse("model:\n  hf_config: .\n", REFIT_ERR_CONFIG, NULL);
  expect(errors, "job.yaml:2:3: model.hf_config: ");
  expect(errors, "/config.json: hidden_size: 1048576 is beyond model.hidden_size's bound "
                 "(expected a positive integer no larger than 131072)");
  free(errors);
}

static void test_missing_file(void **state) {
  (void)state;
  char *errors =
      parse("model:\n  hf_config: nowhere/config.json\n", REFIT_ERR_CONFIG, NULL);
  expect(errors, "job.yaml:2:3: model.hf_config: ");
  expect(errors, "nowhere/config.json: cannot open the model configuration: No such file "
                 "or directory");
  assert_null(strstr(errors, "missing required"));
  free(errors);
}

/* A FIFO as config.json is refused by name at once: opening it for reading
 * would wait for a writer forever (the alarm fails the test instead). */
static void test_fifo_refused(void **state) {
  (void)state;
  char path[128];
  snprintf(path, sizeof(path), "%s/config.json", dir);
  assert_int_equal(unlink(path), 0);
  assert_int_equal(mkfifo(path, 0600), 0);
  alarm(20);
  char *errors = parse("model:\n  hf_config: .\n", REFIT_ERR_CONFIG, NULL);
  alarm(0);
  expect(errors, "job.yaml:2:3: model.hf_config: ");
  expect(errors, "/config.json: the model configuration is a FIFO, not a regular file");
  free(errors);
}

static void test_dense_family(void **state) {
  (void)state;
  write_file("config.json",
             "{\"architectures\": [\"Qwen3ForCausalLM\"], \"hidden_size\": 128,"
             " \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
             " \"num_key_value_heads\": 4, \"head_dim\": 16, \"vocab_size\": 512,"
             " \"intermediate_size\": 384, \"tie_word_embeddings\": true}");
  refit_config_t cfg;
  char *errors = parse("model:\n  hf_config: .\n", REFIT_ERR_CONFIG, &cfg);
  /* generator.ep 2 needs experts: a layout rule, not a config.json one. */
  free(errors);
  layout = "trainer:\n  tp: 2\ngenerator:\n  tp: 2\n";
  errors = parse("model:\n  hf_config: .\n", REFIT_OK, &cfg);
  assert_null(errors);
  assert_int_equal(cfg.model.family, REFIT_FAMILY_QWEN3);
  assert_int_equal(cfg.model.intermediate_size, 384);
  assert_int_equal(cfg.model.tie_word_embeddings, 1);
  layout = "trainer:\n  tp: 2\n  ep: 2\ngenerator:\n  tp: 2\n  ep: 2\n";
}

/* Published-style config.json of the two families from transformers 4.x
 * (torch_dtype, rope_theta / rope_scaling) and 5 (dtype, rope_parameters):
 * the spellings of keys that make no tensor are not read. */
static const char *llama31_8b_json =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\",\n"
    " \"attention_bias\": false, \"mlp_bias\": false, \"hidden_size\": 4096,\n"
    " \"num_hidden_layers\": 32, \"num_attention_heads\": 32,\n"
    " \"num_key_value_heads\": 8, \"head_dim\": 128, \"intermediate_size\": 14336,\n"
    " \"vocab_size\": 128256, \"tie_word_embeddings\": false, \"torch_dtype\": "
    "\"bfloat16\",\n"
    " \"rope_theta\": 500000.0, \"rope_scaling\": {\"factor\": 8.0, \"rope_type\": "
    "\"llama3\"}}\n";

static const char *llama_tied_v5_json =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\",\n"
    " \"hidden_size\": 2048, \"num_hidden_layers\": 16, \"num_attention_heads\": 32,\n"
    " \"num_key_value_heads\": 8, \"head_dim\": 64, \"intermediate_size\": 8192,\n"
    " \"vocab_size\": 128256, \"tie_word_embeddings\": true, \"dtype\": \"bfloat16\",\n"
    " \"rope_parameters\": {\"rope_theta\": 500000.0, \"rope_type\": \"llama3\",\n"
    "   \"factor\": 32.0}}\n";

static const char *qwen25_7b_json =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\",\n"
    " \"hidden_size\": 3584, \"num_hidden_layers\": 28, \"num_attention_heads\": 28,\n"
    " \"num_key_value_heads\": 4, \"intermediate_size\": 18944, \"vocab_size\": 152064,\n"
    " \"tie_word_embeddings\": false, \"use_sliding_window\": false,\n"
    " \"max_window_layers\": 28, \"rope_theta\": 1000000.0, \"torch_dtype\": "
    "\"bfloat16\"}\n";

static refit_model_t parse_json(const char *text) {
  refit_hf_config_t hf;
  char *errors = NULL;
  if (refit_hf_config_parse(text, strlen(text), "config.json", &hf, &errors) != REFIT_OK)
    fail_msg("refused:\n%s", errors ? errors : "");
  free(errors);
  return hf.model;
}

/* config.json with `from` replaced by `to` is refused with `message`. */
static void expect_refused(const char *base, const char *from, const char *to,
                           const char *message) {
  char text[4096];
  const char *at = strstr(base, from);
  assert_non_null(at);
  snprintf(text, sizeof(text), "%.*s%s%s", (int)(at - base), base, to, at + strlen(from));
  refit_hf_config_t hf;
  char *errors = NULL;
  assert_int_equal(refit_hf_config_parse(text, strlen(text), "config.json", &hf, &errors),
                   REFIT_ERR_CONFIG);
  expect(errors, message);
  free(errors);
}

static void test_llama_config(void **state) {
  (void)state;
  refit_model_t m = parse_json(llama31_8b_json);
  assert_int_equal(m.family, REFIT_FAMILY_LLAMA);
  assert_int_equal(m.hidden_size, 4096);
  assert_int_equal(m.num_layers, 32);
  assert_int_equal(m.num_attention_heads, 32);
  assert_int_equal(m.num_kv_heads, 8);
  assert_int_equal(m.head_dim, 128);
  assert_int_equal(m.intermediate_size, 14336);
  assert_int_equal(m.vocab_size, 128256);
  assert_int_equal(m.tie_word_embeddings, 0);
  assert_int_equal(m.num_experts, 0);

  /* transformers 5 spellings, tied embeddings, head_dim != H / heads. */
  m = parse_json(llama_tied_v5_json);
  assert_int_equal(m.family, REFIT_FAMILY_LLAMA);
  assert_int_equal(m.head_dim, 64);
  assert_int_equal(m.tie_word_embeddings, 1);

  /* LlamaConfig's defaults: KV heads = heads, head_dim = H / heads. */
  static const char *bare =
      "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 256,"
      " \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
      " \"intermediate_size\": 512, \"vocab_size\": 1000}";
  m = parse_json(bare);
  assert_int_equal(m.num_kv_heads, 8);
  assert_int_equal(m.head_dim, 32);
  expect_refused(bare, "\"hidden_size\": 256", "\"hidden_size\": 250",
                 "key 'head_dim' is missing and hidden_size 250 is not a multiple of "
                 "num_attention_heads 8 (give head_dim)");

  expect_refused(llama31_8b_json, "\"attention_bias\": false", "\"attention_bias\": true",
                 "attention_bias: true is not supported (it adds q/k/v/o biases");
  expect_refused(llama31_8b_json, "\"mlp_bias\": false", "\"mlp_bias\": true",
                 "mlp_bias: true is not supported (it adds MLP biases");
  expect_refused(llama31_8b_json, "\"mlp_bias\": false", "\"mlp_bias\": 0",
                 "mlp_bias: expected true or false, got 0");
  expect_refused(llama31_8b_json, "\"model_type\": \"llama\"",
                 "\"model_type\": \"qwen2\"",
                 "model_type: \"qwen2\" disagrees with architectures LlamaForCausalLM "
                 "(expected \"llama\")");
  expect_refused(llama31_8b_json, "\"intermediate_size\": 14336,", "",
                 "key 'intermediate_size' is missing");
}

static void test_qwen2_config(void **state) {
  (void)state;
  refit_model_t m = parse_json(qwen25_7b_json);
  assert_int_equal(m.family, REFIT_FAMILY_QWEN2);
  assert_int_equal(m.hidden_size, 3584);
  assert_int_equal(m.num_layers, 28);
  assert_int_equal(m.num_attention_heads, 28);
  assert_int_equal(m.num_kv_heads, 4);
  assert_int_equal(m.head_dim, 128); /* no head_dim key: 3584 / 28 */
  assert_int_equal(m.intermediate_size, 18944);
  assert_int_equal(m.vocab_size, 152064);
  assert_int_equal(m.tie_word_embeddings, 0);
  /* Qwen2's biases always exist: a config that denies them is refused, one
   * that states them is read. */
  expect_refused(qwen25_7b_json, "\"use_sliding_window\"",
                 "\"attention_bias\": false, \"use_sliding_window\"",
                 "attention_bias: false is not supported (Qwen2ForCausalLM always has "
                 "q/k/v biases");
  char text[4096];
  snprintf(text, sizeof(text), "%s", qwen25_7b_json);
  char *at = strstr(text, "\"use_sliding_window\"");
  memmove(at + 24, at, strlen(at) + 1);
  memcpy(at, "\"attention_bias\": true, ", 24);
  m = parse_json(text);
  assert_int_equal(m.family, REFIT_FAMILY_QWEN2);
  /* The experts of another family are not read, and a YAML model section
   * through hf_config plans with the layout. */
  write_file("config.json", qwen25_7b_json);
  layout = "trainer:\n  tp: 4\ngenerator:\n  tp: 2\n  engines: 2\n";
  refit_config_t cfg;
  char *errors =
      parse("model:\n  hf_config: .\n  family: qwen2\n  head_dim: 128\n", REFIT_OK, &cfg);
  assert_null(errors);
  assert_int_equal(cfg.model.family, REFIT_FAMILY_QWEN2);
  assert_int_equal(cfg.model.head_dim, 128);
  errors = parse("model:\n  hf_config: .\n  family: llama\n", REFIT_ERR_CONFIG, NULL);
  expect(errors, "model.family");
  free(errors);
  layout = "trainer:\n  tp: 2\n  ep: 2\ngenerator:\n  tp: 2\n  ep: 2\n";
}

/* DeepSeek-R1's published keys that size tensors (configs/hf/DeepSeek-R1),
 * with some that do not. */
static const char *deepseek_v3_json =
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\",\n"
    " \"hidden_size\": 7168, \"num_hidden_layers\": 61, \"num_attention_heads\": 128,\n"
    " \"num_key_value_heads\": 128, \"q_lora_rank\": 1536, \"kv_lora_rank\": 512,\n"
    " \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128,\n"
    " \"intermediate_size\": 18432, \"moe_intermediate_size\": 2048,\n"
    " \"n_routed_experts\": 256, \"n_shared_experts\": 1, \"first_k_dense_replace\": 3,\n"
    " \"moe_layer_freq\": 1, \"topk_method\": \"noaux_tc\", \"n_group\": 8,\n"
    " \"num_nextn_predict_layers\": 1, \"vocab_size\": 129280,\n"
    " \"tie_word_embeddings\": false, \"quantization_config\": {\"quant_method\": "
    "\"fp8\"}}\n";

/* DeepSeek-V2-Lite's shape (no q LoRA, two shared experts, greedy routing
 * without the score-correction bias). */
static const char *deepseek_v2_lite_json =
    "{\"architectures\": [\"DeepseekV2ForCausalLM\"], \"model_type\": \"deepseek_v2\",\n"
    " \"hidden_size\": 2048, \"num_hidden_layers\": 27, \"num_attention_heads\": 16,\n"
    " \"num_key_value_heads\": 16, \"q_lora_rank\": null, \"kv_lora_rank\": 512,\n"
    " \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128,\n"
    " \"intermediate_size\": 10944, \"moe_intermediate_size\": 1408,\n"
    " \"n_routed_experts\": 64, \"n_shared_experts\": 2, \"first_k_dense_replace\": 1,\n"
    " \"topk_method\": \"greedy\", \"vocab_size\": 102400}\n";

static void test_deepseek_config(void **state) {
  (void)state;
  refit_model_t m = parse_json(deepseek_v3_json);
  assert_int_equal(m.family, REFIT_FAMILY_DEEPSEEK_V3);
  assert_int_equal(m.hidden_size, 7168);
  assert_int_equal(m.num_layers, 61);
  assert_int_equal(m.num_attention_heads, 128);
  assert_int_equal(m.num_kv_heads, 128);
  assert_int_equal(m.head_dim, 64); /* qk_rope_head_dim */
  assert_int_equal(m.q_lora_rank, 1536);
  assert_int_equal(m.kv_lora_rank, 512);
  assert_int_equal(m.qk_nope_head_dim, 128);
  assert_int_equal(m.v_head_dim, 128);
  assert_int_equal(m.intermediate_size, 18432);
  assert_int_equal(m.moe_intermediate_size, 2048);
  assert_int_equal(m.num_experts, 256); /* n_routed_experts */
  assert_int_equal(m.num_shared_experts, 1);
  assert_int_equal(m.first_k_dense_replace, 3);
  assert_int_equal(m.moe_layer_freq, 1);
  assert_int_equal(m.expert_bias, 1); /* noaux_tc */
  assert_int_equal(m.vocab_size, 129280);
  assert_int_equal(m.tie_word_embeddings, 0);

  /* Kimi-K2: DeepseekV3ForCausalLM under model_type kimi_k2. */
  char text[4096];
  snprintf(text, sizeof(text), "%s", deepseek_v3_json);
  memcpy(strstr(text, "\"deepseek_v3\""), "\"kimi_k2\"    ", 13);
  m = parse_json(text);
  assert_int_equal(m.family, REFIT_FAMILY_DEEPSEEK_V3);

  /* V2-Lite: no q LoRA (null), greedy routing (no bias), moe_layer_freq
   * absent (1); num_key_value_heads may be left out (the heads). */
  m = parse_json(deepseek_v2_lite_json);
  assert_int_equal(m.family, REFIT_FAMILY_DEEPSEEK_V3);
  assert_int_equal(m.q_lora_rank, 0);
  assert_int_equal(m.num_shared_experts, 2);
  assert_int_equal(m.moe_layer_freq, 1);
  assert_int_equal(m.expert_bias, 0);
  assert_int_equal(m.head_dim, 64);

  /* topk_method absent: the config class's default (V3 noaux_tc). */
  snprintf(text, sizeof(text), "%s", deepseek_v3_json);
  char *at = strstr(text, "\"topk_method\": \"noaux_tc\", ");
  memmove(at, at + 27, strlen(at + 27) + 1);
  assert_int_equal(parse_json(text).expert_bias, 1);

  expect_refused(
      deepseek_v3_json, "\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true",
      "tie_word_embeddings: true is not supported (DeepseekV3ForCausalLM never "
      "ties lm_head to embed_tokens)");
  expect_refused(
      deepseek_v3_json, "\"model_type\": \"deepseek_v3\"", "\"model_type\": \"qwen2\"",
      "model_type: \"qwen2\" disagrees with architectures DeepseekV3ForCausalLM "
      "(expected \"deepseek_v3\" or one of kimi_k2 deepseek_v2)");
  expect_refused(deepseek_v3_json, "\"topk_method\": \"noaux_tc\"", "\"topk_method\": 1",
                 "topk_method: expected a string, got 1");
  expect_refused(deepseek_v3_json, "\"q_lora_rank\": 1536, ", "",
                 "key 'q_lora_rank' is missing");
  expect_refused(deepseek_v3_json, "\"qk_rope_head_dim\": 64, ", "",
                 "key 'qk_rope_head_dim' is missing");
  expect_refused(deepseek_v3_json, "\"n_routed_experts\": 256, ", "",
                 "key 'n_routed_experts' is missing");
  expect_refused(deepseek_v3_json, "\"first_k_dense_replace\": 3",
                 "\"first_k_dense_replace\": -1",
                 "first_k_dense_replace: expected an integer from 0");

  /* Through a job: the YAML's family agrees, the layout rules apply (tp
   * splits the 128 heads, the shared experts and the dense layers). */
  write_file("config.json", deepseek_v3_json);
  layout = "trainer:\n  tp: 8\n  ep: 8\ngenerator:\n  tp: 8\n  ep: 8\n";
  refit_config_t cfg;
  char *errors = parse("model:\n  hf_config: .\n  family: deepseek_v3\n", REFIT_OK, &cfg);
  assert_null(errors);
  assert_int_equal(cfg.model.expert_bias, 1);
  errors = parse("model:\n  hf_config: .\n  head_dim: 128\n", REFIT_ERR_CONFIG, NULL);
  expect(errors, "head_dim");
  free(errors);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_shape_from_config_json, setup, teardown),
      cmocka_unit_test_setup_teardown(test_yaml_must_agree, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rule_names_the_file_key, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unsupported_values, setup, teardown),
      cmocka_unit_test_setup_teardown(test_table_bounds, setup, teardown),
      cmocka_unit_test_setup_teardown(test_missing_file, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fifo_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_dense_family, setup, teardown),
      cmocka_unit_test_setup_teardown(test_llama_config, setup, teardown),
      cmocka_unit_test_setup_teardown(test_qwen2_config, setup, teardown),
      cmocka_unit_test_setup_teardown(test_deepseek_config, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

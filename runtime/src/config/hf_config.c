/*
 * config.json -> refit_model_t (hf_config.h). Keys and their meaning from
 * transformers' Qwen3Config, Qwen3MoeConfig, LlamaConfig and Qwen2Config
 * (configuration_*.py, 4.x and 5) and the published configs; the MoE layer
 * rule from modeling_qwen3_moe.py: layer i has routed experts iff i is not
 * in mlp_only_layers and (i + 1) % decoder_sparse_step == 0. LlamaConfig and
 * Qwen2Config default num_key_value_heads to num_attention_heads and
 * head_dim to hidden_size / num_attention_heads (Qwen2's 4.x configs have
 * no head_dim key); transformers 5 writes `dtype` and `rope_parameters`
 * for 4.x's `torch_dtype`, `rope_theta` and `rope_scaling`, none of which
 * makes a tensor, so neither spelling is read. DeepseekV3Config (and
 * DeepseekV2Config, Kimi-K2's kimi_k2): MLA's ranks and head dimensions,
 * n_routed_experts, n_shared_experts, first_k_dense_replace and
 * moe_layer_freq; qk_rope_head_dim is read as head_dim (model-families.md
 * section 6).
 */
#include "config/hf_config.h"

#include "reshard/family.h"

#include "core/error.h"
#include "core/file.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define REFIT_HF_KEY_(json, field, yaml, member, is_bool)                                \
  {json, "model." yaml, offsetof(refit_model_t, member), is_bool,                        \
   REFIT_FIELD_MODEL_##field, -1}
#define REFIT_HF_DEEPSEEK_KEY_(json, field, yaml, member)                                \
  {json, "model." yaml, offsetof(refit_model_t, member), 0, REFIT_FIELD_MODEL_##field,   \
   REFIT_FAMILY_DEEPSEEK_V3}

/* The order is the order problems are listed in. Which keys a family
 * requires is refit_hf_required(). */
const refit_hf_key_t refit_hf_config_keys[] = {
    REFIT_HF_KEY_("hidden_size", HIDDEN_SIZE, "hidden_size", hidden_size, 0),
    REFIT_HF_KEY_("num_hidden_layers", NUM_LAYERS, "num_layers", num_layers, 0),
    REFIT_HF_KEY_("num_attention_heads", NUM_ATTENTION_HEADS, "num_attention_heads",
                  num_attention_heads, 0),
    REFIT_HF_KEY_("num_key_value_heads", NUM_KV_HEADS, "num_kv_heads", num_kv_heads, 0),
    REFIT_HF_KEY_("head_dim", HEAD_DIM, "head_dim", head_dim, 0),
    REFIT_HF_KEY_("vocab_size", VOCAB_SIZE, "vocab_size", vocab_size, 0),
    REFIT_HF_KEY_("intermediate_size", INTERMEDIATE_SIZE, "intermediate_size",
                  intermediate_size, 0),
    REFIT_HF_KEY_("num_experts", NUM_EXPERTS, "num_experts", num_experts, 0),
    REFIT_HF_KEY_("moe_intermediate_size", MOE_INTERMEDIATE_SIZE, "moe_intermediate_size",
                  moe_intermediate_size, 0),
    REFIT_HF_KEY_("tie_word_embeddings", TIE_WORD_EMBEDDINGS, "tie_word_embeddings",
                  tie_word_embeddings, 1),
    /* DeepseekV3Config (and DeepseekV2Config): MLA, the experts under
     * their own names, the rope head dimension as head_dim. */
    REFIT_HF_DEEPSEEK_KEY_("n_routed_experts", NUM_EXPERTS, "num_experts", num_experts),
    REFIT_HF_DEEPSEEK_KEY_("qk_rope_head_dim", HEAD_DIM, "head_dim", head_dim),
    REFIT_HF_KEY_("q_lora_rank", Q_LORA_RANK, "q_lora_rank", q_lora_rank, 0),
    REFIT_HF_KEY_("kv_lora_rank", KV_LORA_RANK, "kv_lora_rank", kv_lora_rank, 0),
    REFIT_HF_KEY_("qk_nope_head_dim", QK_NOPE_HEAD_DIM, "qk_nope_head_dim",
                  qk_nope_head_dim, 0),
    REFIT_HF_KEY_("v_head_dim", V_HEAD_DIM, "v_head_dim", v_head_dim, 0),
    REFIT_HF_KEY_("n_shared_experts", NUM_SHARED_EXPERTS, "num_shared_experts",
                  num_shared_experts, 0),
    REFIT_HF_KEY_("first_k_dense_replace", FIRST_K_DENSE_REPLACE, "first_k_dense_replace",
                  first_k_dense_replace, 0),
    REFIT_HF_KEY_("moe_layer_freq", MOE_LAYER_FREQ, "moe_layer_freq", moe_layer_freq, 0),
    /* A string: noaux_tc gives the routers e_score_correction_bias
     * (refit_hf_expert_bias). */
    REFIT_HF_KEY_("topk_method", EXPERT_BIAS, "expert_bias", expert_bias, 0),
};
const int refit_hf_config_nkeys =
    (int)(sizeof(refit_hf_config_keys) / sizeof(refit_hf_config_keys[0]));

/* Is key i read for `family`? The dimensions of the family
 * (refit_field_in_family; intermediate_size of a MoE model sizes only dense
 * layers, which refit refuses, so it is not read there) and those of every
 * family, but tie_word_embeddings, which defaults to false (every config
 * class's own default). */
static bool refit_hf_required(int i, refit_family_t family) {
  const refit_hf_key_t *k = &refit_hf_config_keys[i];
  if (k->field == REFIT_FIELD_MODEL_TIE_WORD_EMBEDDINGS)
    return false;
  if (k->family >= 0 && k->family != (int)family)
    return false;
  for (int j = 0; k->family < 0 && j < refit_hf_config_nkeys; j++)
    if (refit_hf_config_keys[j].field == k->field &&
        refit_hf_config_keys[j].family == (int)family)
      return false; /* the family's own row reads it */
  return refit_field_in_family(k->field, (int)family);
}

/* May key i be absent (or null) for `family`, its value then following
 * from others or from the config class's default (refit_hf_defaults)?
 * Llama's and Qwen2's num_key_value_heads and head_dim (Qwen3's configs
 * always write both, and refit reads them explicitly: Qwen3-30B-A3B's
 * head_dim is not H / heads); DeepSeek's num_key_value_heads (the heads),
 * q_lora_rank and n_shared_experts (null: none, as V2-Lite writes) and
 * moe_layer_freq (1). */
static bool refit_hf_may_default(int i, refit_family_t family) {
  const refit_field_t field = refit_hf_config_keys[i].field;
  if (family == REFIT_FAMILY_DEEPSEEK_V3)
    return field == REFIT_FIELD_MODEL_NUM_KV_HEADS || field == REFIT_FIELD_MODEL_Q_LORA_RANK ||
           field == REFIT_FIELD_MODEL_NUM_SHARED_EXPERTS ||
           field == REFIT_FIELD_MODEL_MOE_LAYER_FREQ;
  return (family == REFIT_FAMILY_LLAMA || family == REFIT_FAMILY_QWEN2) &&
         (field == REFIT_FIELD_MODEL_NUM_KV_HEADS || field == REFIT_FIELD_MODEL_HEAD_DIM);
}

typedef struct {
  const char *file;
  FILE *out; /* one problem per line */
  size_t n;
} refit_hf_problems_t;

static void refit_hf_problem(refit_hf_problems_t *p, const char *fmt, ...)
    REFIT_PRINTF(2, 3);

static void refit_hf_problem(refit_hf_problems_t *p, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(p->out, "%s: ", p->file);
  vfprintf(p->out, fmt, ap);
  fputc('\n', p->out);
  va_end(ap);
  p->n++;
}

/* A JSON value as it appears in messages (compact, cut at 60 bytes). */
static void refit_hf_shown(const json_t *v, char *buf, size_t n) {
  char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
  if (text == NULL) {
    snprintf(buf, n, "(a value)");
    return;
  }
  snprintf(buf, n, "%.60s%s", text, strlen(text) > 60 ? "..." : "");
  free(text);
}

/* Is `name` one of the space-separated names of `list`? */
static bool refit_hf_alias_has(const char *list, const char *name) {
  const size_t n = strlen(name);
  for (const char *p = list; n > 0 && (p = strstr(p, name)) != NULL; p++)
    if ((p == list || p[-1] == ' ') && (p[n] == '\0' || p[n] == ' '))
      return true;
  return false;
}

/* The family from "architectures" (and "model_type" when given). */
static bool refit_hf_family(refit_hf_problems_t *p, const json_t *root,
                            refit_family_t *family) {
  const json_t *arch = json_object_get(root, "architectures");
  char shown[96];
  char names[256];
  refit_family_list(1, names, sizeof(names));
  if (arch == NULL) {
    refit_hf_problem(p, "key 'architectures' is missing (expected one of %s)", names);
    return false;
  }
  refit_hf_shown(arch, shown, sizeof(shown));
  if (!json_is_array(arch) || json_array_size(arch) != 1 ||
      !json_is_string(json_array_get(arch, 0))) {
    refit_hf_problem(p, "architectures: expected a list of one name, got %s", shown);
    return false;
  }
  const char *name = json_string_value(json_array_get(arch, 0));
  int a;
  for (a = 0; a < refit_nfamilies; a++)
    if (strcmp(name, refit_families[a].architecture) == 0 ||
        (refit_families[a].architecture_alias != NULL &&
         strcmp(name, refit_families[a].architecture_alias) == 0))
      break;
  if (a == refit_nfamilies) {
    refit_hf_problem(p, "architectures: %s is not supported; refit reads %s", shown,
                     names);
    return false;
  }
  const refit_family_desc_t *d = &refit_families[a];
  const json_t *type = json_object_get(root, "model_type");
  const char *tv = json_is_string(type) ? json_string_value(type) : "";
  if (type != NULL &&
      (!json_is_string(type) ||
       (strcmp(tv, d->model_type) != 0 &&
        (d->model_type_alias == NULL || !refit_hf_alias_has(d->model_type_alias, tv))))) {
    refit_hf_shown(type, shown, sizeof(shown));
    refit_hf_problem(p,
                     "model_type: %s disagrees with architectures %s "
                     "(expected \"%s\"%s%s)",
                     shown, name, d->model_type, d->model_type_alias ? " or one of " : "",
                     d->model_type_alias ? d->model_type_alias : "");
    return false;
  }
  *family = (refit_family_t)a;
  return true;
}

/* An integer key: a JSON integer in [lo, hi]. */
static bool refit_hf_int(refit_hf_problems_t *p, const char *key, const json_t *v,
                         int64_t lo, int64_t hi, int64_t *out) {
  char shown[96];
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
    refit_hf_shown(v, shown, sizeof(shown));
    refit_hf_problem(p, "%s: expected an integer from %" PRId64 " to %" PRId64 ", got %s",
                     key, lo, hi, shown);
    return false;
  }
  *out = (int64_t)json_integer_value(v);
  return true;
}

/* A boolean key that must not be `refused` (true or false) for this family:
 * the tensors it would add (or take away) are not the family's. */
static void refit_hf_flag(refit_hf_problems_t *p, const json_t *root, const char *key,
                          bool refused, const char *why) {
  char shown[96];
  const json_t *v = json_object_get(root, key);
  if (v == NULL)
    return;
  if (!json_is_boolean(v)) {
    refit_hf_shown(v, shown, sizeof(shown));
    refit_hf_problem(p, "%s: expected true or false, got %s", key, shown);
  } else if (json_is_true(v) == refused) {
    refit_hf_problem(p, "%s: %s is not supported (%s)", key, refused ? "true" : "false",
                     why);
  }
}

/* Keys whose values refit cannot represent are refused, not ignored. */
static void refit_hf_unsupported(refit_hf_problems_t *p, const json_t *root,
                                 refit_family_t family) {
  char shown[96];
  switch (family) {
  case REFIT_FAMILY_QWEN2:
    /* Qwen2Config has no such key: vLLM's Qwen2Attention always builds the
     * q/k/v biases and never an o_proj one, so a config that says there
     * are none describes another model. */
    refit_hf_flag(p, root, "attention_bias", false,
                  "Qwen2ForCausalLM always has q/k/v biases, and refit moves them");
    break;
  case REFIT_FAMILY_LLAMA:
    refit_hf_flag(p, root, "attention_bias", true,
                  "it adds q/k/v/o biases to LlamaForCausalLM, which refit "
                  "does not move");
    refit_hf_flag(p, root, "mlp_bias", true,
                  "it adds MLP biases to LlamaForCausalLM, which refit does not move");
    break;
  case REFIT_FAMILY_QWEN3:
  case REFIT_FAMILY_QWEN3_MOE:
    refit_hf_flag(p, root, "attention_bias", true,
                  "Qwen3 has no q/k/v/o biases and refit moves none");
    break;
  case REFIT_FAMILY_DEEPSEEK_V3: {
    /* DeepseekV2ForCausalLM always builds its own ParallelLMHead. */
    refit_hf_flag(p, root, "tie_word_embeddings", true,
                  "DeepseekV3ForCausalLM never ties lm_head to embed_tokens");
    break;
  }
  }
  if (family != REFIT_FAMILY_QWEN3_MOE)
    return;
  const json_t *step = json_object_get(root, "decoder_sparse_step");
  int64_t s = 1;
  if (step != NULL && refit_hf_int(p, "decoder_sparse_step", step, 1, INT64_MAX, &s) &&
      s != 1)
    refit_hf_problem(p,
                     "decoder_sparse_step: %" PRId64 " makes layers with "
                     "(i + 1) %% %" PRId64 " != 0 dense MLP layers inside a "
                     "MoE model; refit does not support mixed dense and "
                     "MoE layers yet (use 1)",
                     s, s);
  const json_t *only = json_object_get(root, "mlp_only_layers");
  if (only == NULL || json_is_null(only))
    return;
  refit_hf_shown(only, shown, sizeof(shown));
  if (!json_is_array(only))
    refit_hf_problem(p,
                     "mlp_only_layers: expected a list of layer indices, "
                     "got %s",
                     shown);
  else if (json_array_size(only) > 0)
    refit_hf_problem(p,
                     "mlp_only_layers: %s makes those layers dense MLP "
                     "layers inside a MoE model; refit does not support "
                     "mixed dense and MoE layers yet (use [])",
                     shown);
}

/* The index of the key of `field` in refit_hf_config_keys. */
static int refit_hf_key_of(refit_field_t field) {
  for (int i = 0; i < refit_hf_config_nkeys; i++)
    if (refit_hf_config_keys[i].field == field)
      return i;
  return -1;
}

/* Llama's, Qwen2's and DeepSeek's defaults for keys their configs may
 * leave out (LlamaConfig / Qwen2Config / DeepseekV3Config __init__):
 * num_key_value_heads = num_attention_heads, head_dim = hidden_size /
 * num_attention_heads (never for DeepSeek, whose head_dim is
 * qk_rope_head_dim). A value that follows is as given (YAML must agree
 * with it). */
static void refit_hf_defaults(refit_hf_problems_t *p, refit_hf_config_t *hf,
                              refit_family_t family) {
  refit_model_t *m = &hf->model;
  const int heads = refit_hf_key_of(REFIT_FIELD_MODEL_NUM_ATTENTION_HEADS);
  const int hidden = refit_hf_key_of(REFIT_FIELD_MODEL_HIDDEN_SIZE);
  const int kv = refit_hf_key_of(REFIT_FIELD_MODEL_NUM_KV_HEADS);
  const int head_dim = refit_hf_key_of(REFIT_FIELD_MODEL_HEAD_DIM);
  if (!(hf->present >> heads & 1))
    return; /* already reported */
  if (refit_hf_may_default(kv, family) && !(hf->present >> kv & 1)) {
    m->num_kv_heads = m->num_attention_heads;
    hf->present |= UINT64_C(1) << kv;
  }
  if (refit_hf_may_default(head_dim, family) && !(hf->present >> head_dim & 1) &&
      (hf->present >> hidden & 1)) {
    if (m->hidden_size % m->num_attention_heads != 0) {
      refit_hf_problem(p,
                       "key 'head_dim' is missing and hidden_size %" PRId64
                       " is not a multiple of num_attention_heads %" PRId64
                       " (give head_dim)",
                       m->hidden_size, m->num_attention_heads);
      return;
    }
    m->head_dim = m->hidden_size / m->num_attention_heads;
    hf->present |= UINT64_C(1) << head_dim;
  }
}

/* topk_method: "noaux_tc" (V3, R1, Kimi-K2) gives every router
 * mlp.gate.e_score_correction_bias (vLLM deepseek_v2.py DeepseekV2MoE),
 * other methods none; absent, the config class's default decides
 * (DeepseekV3Config noaux_tc, DeepseekV2Config greedy). */
static bool refit_hf_expert_bias(refit_hf_problems_t *p, const json_t *root,
                                 const json_t *v, int64_t *out) {
  char shown[96];
  if (v == NULL) {
    const json_t *arch = json_array_get(json_object_get(root, "architectures"), 0);
    *out = json_is_string(arch) &&
           strcmp(json_string_value(arch), "DeepseekV3ForCausalLM") == 0;
    return true;
  }
  if (!json_is_string(v)) {
    refit_hf_shown(v, shown, sizeof(shown));
    refit_hf_problem(p, "topk_method: expected a string, got %s", shown);
    return false;
  }
  *out = strcmp(json_string_value(v), "noaux_tc") == 0;
  return true;
}

static void refit_hf_read(refit_hf_problems_t *p, const json_t *root,
                          refit_hf_config_t *hf) {
  if (!json_is_object(root)) {
    refit_hf_problem(p, "expected a JSON object at the top level");
    return;
  }
  refit_family_t family = REFIT_FAMILY_QWEN3;
  const bool known = refit_hf_family(p, root, &family);
  hf->model.family = family;
  refit_hf_unsupported(p, root, family);
  for (int i = 0; i < refit_hf_config_nkeys; i++) {
    const refit_hf_key_t *k = &refit_hf_config_keys[i];
    const json_t *v = json_object_get(root, k->json_key);
    char *field = (char *)&hf->model + k->offset;
    char shown[96];
    if (!known || !refit_hf_required(i, family)) {
      if (k->is_bool && v != NULL) {
        if (!json_is_boolean(v)) {
          refit_hf_shown(v, shown, sizeof(shown));
          refit_hf_problem(p, "%s: expected true or false, got %s", k->json_key, shown);
        } else {
          *(int *)field = json_is_true(v);
          hf->present |= UINT64_C(1) << i;
        }
      }
      continue;
    }
    int64_t value = 0;
    if (k->field == REFIT_FIELD_MODEL_EXPERT_BIAS) {
      if (refit_hf_expert_bias(p, root, v, &value)) {
        *(int *)field = (int)value;
        hf->present |= UINT64_C(1) << i;
      }
      continue;
    }
    const bool null_only = k->field == REFIT_FIELD_MODEL_Q_LORA_RANK ||
                           k->field == REFIT_FIELD_MODEL_NUM_SHARED_EXPERTS;
    if ((null_only ? json_is_null(v) : v == NULL || json_is_null(v)) &&
        refit_hf_may_default(i, family)) {
      /* DeepseekV3Config's null q_lora_rank and n_shared_experts mean
       * none, an absent moe_layer_freq 1; the others follow from other
       * keys (refit_hf_defaults). */
      if (k->field == REFIT_FIELD_MODEL_MOE_LAYER_FREQ ||
          k->field == REFIT_FIELD_MODEL_Q_LORA_RANK ||
          k->field == REFIT_FIELD_MODEL_NUM_SHARED_EXPERTS) {
        value = k->field == REFIT_FIELD_MODEL_MOE_LAYER_FREQ;
        memcpy(field, &value, sizeof(value));
        hf->present |= UINT64_C(1) << i;
      }
      continue;
    }
    if (v == NULL) {
      refit_hf_problem(p, "key '%s' is missing (%s reads it explicitly)", k->json_key,
                       k->yaml_key);
      continue;
    }
    if (!refit_hf_int(p, k->json_key, v, refit_field_may_be_zero(k->field) ? 0 : 1,
                      INT64_MAX / 4, &value))
      continue;
    memcpy(field, &value, sizeof(value));
    hf->present |= UINT64_C(1) << i;
  }
  if (known)
    refit_hf_defaults(p, hf, family);
}

refit_status_t refit_hf_config_parse(const char *text, size_t len, const char *filename,
                                     refit_hf_config_t *out, char **errors) {
  char *list = NULL;
  size_t list_len = 0;
  refit_hf_problems_t p = {filename ? filename : "config.json", NULL, 0};
  refit_hf_config_t hf;
  json_error_t jerr;
  if (errors)
    *errors = NULL;
  memset(&hf, 0, sizeof(hf));
  p.out = open_memstream(&list, &list_len);
  if (p.out == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "%s: out of memory", p.file);
  if (len > REFIT_HF_CONFIG_MAX_BYTES) {
    refit_hf_problem(&p, "%zu bytes; a config.json is at most %u", len,
                     REFIT_HF_CONFIG_MAX_BYTES);
  } else {
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
      refit_hf_problem(&p, "line %d column %d: not valid JSON: %s", jerr.line,
                       jerr.column, jerr.text);
    else
      refit_hf_read(&p, root, &hf);
    json_decref(root);
  }
  if (fclose(p.out) != 0 || list == NULL) {
    free(list);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "%s: out of memory", p.file);
  }
  if (p.n > 0) {
    refit_error_set(REFIT_ERR_CONFIG, "%s", list);
    if (errors)
      *errors = list;
    else
      free(list);
    return REFIT_ERR_CONFIG;
  }
  free(list);
  *out = hf;
  return REFIT_OK;
}

/* A one-line failure returned the way refit_hf_config_parse returns its
 * list. */
static refit_status_t refit_hf_fail(char **errors, const char *fmt, ...)
    REFIT_PRINTF(2, 3);

static refit_status_t refit_hf_fail(char **errors, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  refit_error_setv(REFIT_ERR_CONFIG, fmt, ap);
  va_end(ap);
  if (errors) {
    size_t n = strlen(refit_last_error());
    *errors = malloc(n + 2);
    if (*errors)
      snprintf(*errors, n + 2, "%s\n", refit_last_error());
  }
  return REFIT_ERR_CONFIG;
}

refit_status_t refit_hf_config_load(const char *path, refit_hf_config_t *out, char *file,
                                    size_t file_len, char **errors) {
  char name[4096];
  struct stat sb;
  if (errors)
    *errors = NULL;
  snprintf(name, sizeof(name), "%s", path);
  if (stat(name, &sb) == 0 && S_ISDIR(sb.st_mode))
    snprintf(name, sizeof(name), "%s%sconfig.json", path,
             path[0] && path[strlen(path) - 1] == '/' ? "" : "/");
  if (file)
    snprintf(file, file_len, "%s", name);
  int fd = -1;
  if (refit_file_open_regular(name, "model configuration", &fd, &sb) != REFIT_OK) {
    char why[1024];
    snprintf(why, sizeof(why), "%s", refit_last_error());
    return refit_hf_fail(errors, "%s", why);
  }
  FILE *f = fdopen(fd, "rb");
  if (f == NULL) {
    close(fd);
    return refit_hf_fail(errors, "%s: cannot open it: %s", name, strerror(errno));
  }
  if ((uint64_t)sb.st_size > REFIT_HF_CONFIG_MAX_BYTES) {
    fclose(f);
    return refit_hf_fail(errors, "%s: not a regular file of at most %u bytes", name,
                         REFIT_HF_CONFIG_MAX_BYTES);
  }
  char *text = malloc((size_t)sb.st_size + 1);
  if (text == NULL) {
    fclose(f);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "%s: %lld bytes", name, (long long)sb.st_size);
  }
  const size_t got = fread(text, 1, (size_t)sb.st_size, f);
  const int bad = ferror(f);
  fclose(f);
  if (bad || got != (size_t)sb.st_size) {
    free(text);
    return refit_hf_fail(errors, "%s: read %zu of %lld bytes", name, got,
                         (long long)sb.st_size);
  }
  refit_status_t st = refit_hf_config_parse(text, got, name, out, errors);
  free(text);
  return st;
}

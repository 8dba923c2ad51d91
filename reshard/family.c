/*
 * The family table (family.h). Each row is read from the frameworks'
 * sources: vLLM's qwen3.py / qwen3_moe.py (q_norm, k_norm, no biases),
 * llama.py (LlamaAttention: no q/k norm; attention_bias false for Llama
 * 3.x, refused otherwise by hf_config.c), qwen2.py (Qwen2Attention:
 * QKVParallelLinear(bias=True), o_proj and the MLP without a bias, no q/k
 * norm); Megatron-Bridge qwen2_bridge.py (add_qkv_bias, a QKVMapping on
 * linear_qkv.bias), llama_bridge.py and qwen3_bridge.py (qk_layernorm). deepseek_v3: vLLM
 * deepseek_v2.py (DeepseekV2MLAAttention, DeepseekV2MoE with shared_experts, the
 * DeepseekV2DecoderLayer rule for MoE layers), Megatron-Bridge
 * deepseek/common.py and kimi/kimi_bridge.py (model_type kimi_k2); the
 * facts are model-families.md section 3.
 */
#include "reshard/family.h"

#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const refit_family_desc_t refit_families[] = {
    [REFIT_FAMILY_QWEN3] = {"qwen3", "Qwen3ForCausalLM", "qwen3", 0, 1, 0, 0, 0, 0, NULL,
                            NULL},
    [REFIT_FAMILY_QWEN3_MOE] = {"qwen3_moe", "Qwen3MoeForCausalLM", "qwen3_moe", 1, 1, 0,
                                0, 0, 0, NULL, NULL},
    [REFIT_FAMILY_LLAMA] = {"llama", "LlamaForCausalLM", "llama", 0, 0, 0, 0, 0, 0, NULL,
                            NULL},
    [REFIT_FAMILY_QWEN2] = {"qwen2", "Qwen2ForCausalLM", "qwen2", 0, 0, 1, 0, 0, 0, NULL,
                            NULL},
    [REFIT_FAMILY_DEEPSEEK_V3] = {"deepseek_v3", "DeepseekV3ForCausalLM", "deepseek_v3",
                                  1, 0, 0, 1, 1, 1, "DeepseekV2ForCausalLM",
                                  "kimi_k2 deepseek_v2"},
};
const int refit_nfamilies = (int)(sizeof(refit_families) / sizeof(refit_families[0]));

const refit_family_desc_t *refit_family_desc(int family) {
  return family >= 0 && family < refit_nfamilies ? &refit_families[family] : NULL;
}

void refit_family_list(int architectures, char *buf, size_t n) {
  size_t used = 0;
  if (n > 0)
    buf[0] = '\0';
  for (int f = 0; f < refit_nfamilies && used < n; f++)
    used += (size_t)snprintf(buf + used, n - used, "%s%s",
                             f == 0                     ? ""
                             : f == refit_nfamilies - 1 ? " or "
                                                        : ", ",
                             architectures ? refit_families[f].architecture
                                           : refit_families[f].name);
}

/* The MLA dimensions and DeepSeek's MoE layout keys. */
static int refit_field_mla(refit_field_t f) {
  return f == REFIT_FIELD_MODEL_Q_LORA_RANK || f == REFIT_FIELD_MODEL_KV_LORA_RANK ||
         f == REFIT_FIELD_MODEL_QK_NOPE_HEAD_DIM || f == REFIT_FIELD_MODEL_V_HEAD_DIM;
}

static int refit_field_deepseek_moe(refit_field_t f) {
  return f == REFIT_FIELD_MODEL_NUM_SHARED_EXPERTS ||
         f == REFIT_FIELD_MODEL_FIRST_K_DENSE_REPLACE ||
         f == REFIT_FIELD_MODEL_MOE_LAYER_FREQ || f == REFIT_FIELD_MODEL_EXPERT_BIAS;
}

int refit_field_family_specific(refit_field_t f) {
  return f == REFIT_FIELD_MODEL_INTERMEDIATE_SIZE || f == REFIT_FIELD_MODEL_NUM_EXPERTS ||
         f == REFIT_FIELD_MODEL_MOE_INTERMEDIATE_SIZE || refit_field_mla(f) ||
         refit_field_deepseek_moe(f);
}

int refit_field_may_be_zero(refit_field_t f) {
  return f == REFIT_FIELD_MODEL_Q_LORA_RANK ||
         f == REFIT_FIELD_MODEL_NUM_SHARED_EXPERTS ||
         f == REFIT_FIELD_MODEL_FIRST_K_DENSE_REPLACE ||
         f == REFIT_FIELD_MODEL_MOE_LAYER_FREQ || f == REFIT_FIELD_MODEL_EXPERT_BIAS;
}

int refit_field_in_family(refit_field_t f, int family) {
  const refit_family_desc_t *d = refit_family_desc(family);
  if (!refit_field_family_specific(f))
    return 1;
  if (d == NULL)
    return 0;
  if (refit_field_mla(f))
    return d->mla;
  if (refit_field_deepseek_moe(f))
    return d->deepseek_moe;
  /* DeepSeek's dense first layers are sized by intermediate_size. */
  return f == REFIT_FIELD_MODEL_INTERMEDIATE_SIZE ? !d->moe || d->deepseek_moe : d->moe;
}

int refit_layer_is_moe(const refit_model_t *m, int64_t l) {
  const refit_family_desc_t *d = refit_family_desc(m->family);
  if (d == NULL || !d->moe)
    return 0;
  if (!d->deepseek_moe)
    return 1;
  const int64_t freq = m->moe_layer_freq > 0 ? m->moe_layer_freq : 1;
  return l >= m->first_k_dense_replace && l % freq == 0;
}

int refit_model_has_dense_layers(const refit_model_t *m) {
  for (int64_t l = 0; l < m->num_layers; l++)
    if (!refit_layer_is_moe(m, l))
      return 1;
  return 0;
}

const char *refit_family_skipped(const refit_model_t *m, const refit_trainer_layout_t *tr,
                                 const char *name) {
  const refit_family_desc_t *d = refit_family_desc(m->family);
  if (d == NULL || !d->mtp)
    return NULL;
  const size_t np = strlen(tr->name_prefix);
  const char *rest = strncmp(name, tr->name_prefix, np) == 0 ? name + np : NULL;
  if (rest != NULL && strncmp(rest, "mtp.layers.", 11) == 0)
    return "a multi-token-prediction layer (Megatron-Core mtp.layers.*), which vLLM's "
           "main model skips: not a refit target";
  /* Hugging Face: model.layers.{l}. with l >= num_layers (the published
   * checkpoints put the MTP layer there; vLLM skips it by that index). */
  const char *hf = "model.layers.";
  if (strncmp(name, hf, strlen(hf)) != 0)
    return NULL;
  const char *p = name + strlen(hf);
  char *end = NULL;
  errno = 0;
  const long long l = strtoll(p, &end, 10);
  if (end == p || *end != '.' || errno != 0 || !isdigit((unsigned char)*p))
    return NULL;
  return l >= m->num_layers
             ? "a multi-token-prediction layer (Hugging Face model.layers.{l} with l >= "
               "num_hidden_layers), which vLLM's main model skips: not a refit target"
             : NULL;
}

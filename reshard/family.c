/*
 * The family table (family.h). Each row is read from the frameworks'
 * sources: vLLM's qwen3.py / qwen3_moe.py (q_norm, k_norm, no biases),
 * llama.py (LlamaAttention: no q/k norm; attention_bias false for Llama
 * 3.x, refused otherwise by hf_config.c), qwen2.py (Qwen2Attention:
 * QKVParallelLinear(bias=True), o_proj and the MLP without a bias, no q/k
 * norm); Megatron-Bridge qwen2_bridge.py (add_qkv_bias, a QKVMapping on
 * linear_qkv.bias), llama_bridge.py and qwen3_bridge.py (qk_layernorm).
 */
#include "reshard/family.h"

#include <stddef.h>

const refit_family_desc_t refit_families[] = {
    [REFIT_FAMILY_QWEN3] = {"qwen3", "Qwen3ForCausalLM", "qwen3", 0, 1, 0},
    [REFIT_FAMILY_QWEN3_MOE] = {"qwen3_moe", "Qwen3MoeForCausalLM", "qwen3_moe", 1, 1, 0},
    [REFIT_FAMILY_LLAMA] = {"llama", "LlamaForCausalLM", "llama", 0, 0, 0},
    [REFIT_FAMILY_QWEN2] = {"qwen2", "Qwen2ForCausalLM", "qwen2", 0, 0, 1},
};
const int refit_nfamilies = (int)(sizeof(refit_families) / sizeof(refit_families[0]));

const refit_family_desc_t *refit_family_desc(int family) {
  return family >= 0 && family < refit_nfamilies ? &refit_families[family] : NULL;
}

int refit_field_family_specific(refit_field_t f) {
  return f == REFIT_FIELD_MODEL_INTERMEDIATE_SIZE || f == REFIT_FIELD_MODEL_NUM_EXPERTS ||
         f == REFIT_FIELD_MODEL_MOE_INTERMEDIATE_SIZE;
}

int refit_field_in_family(refit_field_t f, int family) {
  const refit_family_desc_t *d = refit_family_desc(family);
  if (!refit_field_family_specific(f))
    return 1;
  if (d == NULL)
    return 0;
  return f == REFIT_FIELD_MODEL_INTERMEDIATE_SIZE ? !d->moe : d->moe;
}

/*
 * The model families, declared once: which tensors a family's layers hold
 * beyond those every family has (attention q/k/v/o, the two norms, an MLP),
 * and how Hugging Face names it. The catalog builders (catalog_hf.c,
 * catalog_megatron.c, catalog_runtime.c), the layout rules, the config and
 * hf_config.c consult this table instead of testing for a family by name,
 * so a family that differs only in which of these tensors exist is one row.
 * The facts of each row are in ../shared/reference/framework-layouts.md
 * (qwen3, qwen3_moe) and model-families.md sections 1, 2 and 3 (llama,
 * qwen2, deepseek_v3).
 *
 * Pure C: no MPI, no CUDA, no I/O.
 */
#ifndef REFIT_RESHARD_FAMILY_H
#define REFIT_RESHARD_FAMILY_H

#include "reshard/layout.h"

#include <stddef.h>

typedef struct {
  const char *name;         /* model.family */
  const char *architecture; /* config.json "architectures": [name] */
  const char *model_type;   /* config.json "model_type" */
  /* Every layer has routed experts (num_experts, moe_intermediate_size)
   * instead of a dense MLP (intermediate_size). */
  int moe;
  /* Per-head RMSNorms of q and k: self_attn.q_norm.weight and
   * k_norm.weight [head_dim] (Megatron q_layernorm / k_layernorm). */
  int qk_norm;
  /* Biases of q_proj, k_proj and v_proj (never o_proj or the MLP):
   * Megatron's fused linear_qkv.bias, vLLM's qkv_proj.bias. */
  int qkv_bias;
  /* Multi-head latent attention instead of q/k/v (DeepSeek-V2/V3): q_a_proj,
   * q_a_layernorm and q_b_proj (q_proj when q_lora_rank is 0),
   * kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj; the model keys
   * q_lora_rank, kv_lora_rank, qk_nope_head_dim and v_head_dim. */
  int mla;
  /* DeepSeek's MoE layout: dense MLP layers below first_k_dense_replace
   * (and off the moe_layer_freq grid) beside the MoE layers, and shared
   * experts in every MoE layer (num_shared_experts, 0 for none). */
  int deepseek_moe;
  /* Multi-token-prediction layers may sit beside the model
   * (num_nextn_predict_layers): Hugging Face model.layers.{num_layers + i}.*,
   * Megatron-Core mtp.layers.{i}.*. vLLM's main model skips them by name,
   * so they are no refit target: a trainer's registration of one is
   * skipped, not refused (refit_family_skipped). */
  int mtp;
  /* A second config.json architecture that maps the same way
   * (DeepseekV2ForCausalLM, which vLLM serves with the same class), and
   * further "model_type" values, space-separated (Kimi-K2 writes kimi_k2
   * under DeepseekV3ForCausalLM); NULL when none. */
  const char *architecture_alias;
  const char *model_type_alias;
} refit_family_desc_t;

/* The row of family f, or NULL for a value that is no family. */
const refit_family_desc_t *refit_family_desc(int family);

/* Families, in refit_family_t order. */
extern const refit_family_desc_t refit_families[];
extern const int refit_nfamilies;

/* Every family's name (or, with `architectures`, its config.json
 * architecture) as "a, b or c" into buf (n bytes), for messages. */
void refit_family_list(int architectures, char *buf, size_t n);

/* Does a model of `family` have dimension f? intermediate_size belongs to
 * the families with dense MLP layers, num_experts and moe_intermediate_size
 * to the MoE ones, the MLA and DeepSeek MoE keys to deepseek_v3, every
 * other field to all. A family out of range has none of the
 * family-specific ones. */
int refit_field_in_family(refit_field_t f, int family);

/* Is f a dimension of some families only (the MLP's, MLA's)? */
int refit_field_family_specific(refit_field_t f);

/* May a family-specific field f be 0 (q_lora_rank: no q LoRA;
 * num_shared_experts, first_k_dense_replace: none; moe_layer_freq: 1;
 * expert_bias: a flag)? The
 * others must be positive in the families that have them. */
int refit_field_may_be_zero(refit_field_t f);

/* Does layer l of model m have routed experts (else a dense MLP)? Every
 * layer of qwen3_moe, none of the dense families; for deepseek_v3 the
 * layers l >= first_k_dense_replace with l % moe_layer_freq == 0 (vLLM
 * DeepseekV2DecoderLayer; moe_layer_freq 0 reads as 1). */
int refit_layer_is_moe(const refit_model_t *m, int64_t l);

/* Why a trainer tensor `name` (as registered, trainer.name_prefix
 * included) is no refit target although the trainer holds it: the reason
 * for a multi-token-prediction layer's tensor of a family with `mtp`,
 * NULL for every other name. */
const char *refit_family_skipped(const refit_model_t *m, const refit_trainer_layout_t *tr,
                                 const char *name);

/* Does model m have any dense MLP layer? */
int refit_model_has_dense_layers(const refit_model_t *m);

#endif /* REFIT_RESHARD_FAMILY_H */

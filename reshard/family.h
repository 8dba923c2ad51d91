/*
 * The model families, declared once: which tensors a family's layers hold
 * beyond those every family has (attention q/k/v/o, the two norms, an MLP),
 * and how Hugging Face names it. The catalog builders (catalog_hf.c,
 * catalog_megatron.c, catalog_runtime.c), the layout rules, the config and
 * hf_config.c consult this table instead of testing for a family by name,
 * so a family that differs only in which of these tensors exist is one row.
 * The facts of each row are in ../shared/reference/framework-layouts.md
 * (qwen3, qwen3_moe) and model-families.md sections 1 and 2 (llama, qwen2).
 *
 * Pure C: no MPI, no CUDA, no I/O.
 */
#ifndef REFIT_RESHARD_FAMILY_H
#define REFIT_RESHARD_FAMILY_H

#include "reshard/layout.h"

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
} refit_family_desc_t;

/* The row of family f, or NULL for a value that is no family. */
const refit_family_desc_t *refit_family_desc(int family);

/* Families, in refit_family_t order. */
extern const refit_family_desc_t refit_families[];
extern const int refit_nfamilies;

/* Does a model of `family` have dimension f? intermediate_size belongs to
 * the dense families, num_experts and moe_intermediate_size to the MoE
 * ones, every other field to all. A family out of range has none of the
 * family-specific ones. */
int refit_field_in_family(refit_field_t f, int family);

/* Is f a dimension of some families only (the MLP's)? */
int refit_field_family_specific(refit_field_t f);

#endif /* REFIT_RESHARD_FAMILY_H */

/*
 * Megatron-Core's trainer tensors (catalog_internal.h): the fused tensors
 * and names named_parameters() gives on their holders (linear_qkv,
 * linear_fc1, experts numbered per ep rank, layers numbered per pipeline
 * stage), each as runs of Hugging Face rows.
 */
#include "reshard/catalog_internal.h"
#include "reshard/family.h"

/* Append trainer tensor `name` holding Hugging Face tensor `hf` row for row
 * (same shape), split as `split` over the stage's tp ranks. */
static refit_status_t refit_add_alias(refit_catalog_builder_t *b, int32_t *index,
                                      int32_t hf, int stage, refit_split_t split,
                                      const char *name) {
  const refit_src_tensor_t h = b->cat->hf[hf];
  REFIT_CHECK(
      refit_add_src(b, index, stage, h.layer, h.role, split, h.rows, h.cols, "%s", name));
  return refit_add_run(b, *index, hf, 0, 0, h.rows);
}

/* [gate_r; up_r] for r < parts: Megatron's linear_fc1 keeps each tp (or etp)
 * rank's gate rows and up rows together (megatron/core/transformer/mlp.py;
 * Megatron-Bridge GatedMLPMapping, 067f987d). */
static refit_status_t refit_add_fc1_runs(refit_catalog_builder_t *b, int32_t src,
                                         int32_t gate, int32_t up, int64_t rows,
                                         int parts) {
  const int64_t f = rows / parts;
  for (int r = 0; r < parts; r++) {
    REFIT_CHECK(refit_add_run(b, src, gate, 2 * r * f, r * f, f));
    REFIT_CHECK(refit_add_run(b, src, up, 2 * r * f + f, r * f, f));
  }
  return REFIT_OK;
}

/* linear_qkv's rows (its weight's, and its bias's element for element),
 * globally [q..q k v] per query group: per_group query heads, then the
 * group's K head, then its V head (attention.py
 * get_query_key_value_tensors; Bridge QKVMapping, and for the bias
 * qwen2_bridge.py's second QKVMapping on linear_qkv.bias). A tp rank holds
 * a contiguous 1/tp of these rows. */
static refit_status_t refit_add_qkv_runs(refit_catalog_builder_t *b, int32_t src,
                                         int32_t q, int32_t k, int32_t v) {
  const refit_model_t *m = &b->cat->model;
  const int64_t D = m->head_dim, groups = m->num_kv_heads;
  const int64_t per_group = m->num_attention_heads / groups; /* q heads */
  for (int64_t g = 0; g < groups; g++) {
    const int64_t row0 = g * (per_group + 2) * D;
    REFIT_CHECK(refit_add_run(b, src, q, row0, g * per_group * D, per_group * D));
    REFIT_CHECK(refit_add_run(b, src, k, row0 + per_group * D, g * D, D));
    REFIT_CHECK(refit_add_run(b, src, v, row0 + (per_group + 1) * D, g * D, D));
  }
  return REFIT_OK;
}

/* GQA attention: the input norm (fused into linear_qkv by TE), linear_qkv
 * interleaved per query group (and its bias), the q/k norms. */
static refit_status_t refit_build_megatron_gqa(refit_catalog_builder_t *b, const char *p,
                                               int stage, int l,
                                               const refit_layer_src_t *ls) {
  const refit_model_t *m = &b->cat->model;
  const refit_family_desc_t *fam = refit_family_desc(m->family);
  const int te = b->cat->trainer.spec == REFIT_SPEC_TE;
  const int64_t D = m->head_dim, H = m->hidden_size;
  const int64_t rows = (m->num_attention_heads + 2 * m->num_kv_heads) * D;
  char name[REFIT_NAME_MAX];
  int32_t idx;

  refit_name_fmt(name, "%s%s", p,
                 te ? "self_attention.linear_qkv.layer_norm_weight"
                    : "input_layernorm.weight");
  REFIT_CHECK(refit_add_alias(b, &idx, ls->in_norm, stage, REFIT_SPLIT_NONE, name));
  refit_name_fmt(name, "%sself_attention.linear_qkv.weight", p);
  REFIT_CHECK(refit_add_src(b, &idx, stage, l, REFIT_ROLE_LINEAR, REFIT_SPLIT_ROWS, rows,
                            H, "%s", name));
  REFIT_CHECK(refit_add_qkv_runs(b, idx, ls->q, ls->k, ls->v));
  if (fam->qkv_bias) {
    /* The same name under both specs: TE's LayerNormLinear and the local
     * ColumnParallelLinear call it bias. */
    refit_name_fmt(name, "%sself_attention.linear_qkv.bias", p);
    REFIT_CHECK(refit_add_src(b, &idx, stage, l, REFIT_ROLE_BIAS, REFIT_SPLIT_ROWS, rows,
                              1, "%s", name));
    REFIT_CHECK(refit_add_qkv_runs(b, idx, ls->q_bias, ls->k_bias, ls->v_bias));
  }
  if (fam->qk_norm) {
    refit_name_fmt(name, "%sself_attention.q_layernorm.weight", p);
    REFIT_CHECK(refit_add_alias(b, &idx, ls->q_norm, stage, REFIT_SPLIT_NONE, name));
    refit_name_fmt(name, "%sself_attention.k_layernorm.weight", p);
    REFIT_CHECK(refit_add_alias(b, &idx, ls->k_norm, stage, REFIT_SPLIT_NONE, name));
  }
  return REFIT_OK;
}

/*
 * Multi-latent attention (Megatron-LM multi_latent_attention.py
 * MLASelfAttention; Bridge deepseek/common.py; model-families.md 3.2): the
 * input norm stays apart under both specs; the down projections are TE
 * Linears duplicated on every tp rank under the TE spec and
 * ColumnParallelLinears split by rows under the local one; their norms are
 * fused into the up projections by TE (layer_norm_weight) and separate
 * (q_layernorm, kv_layernorm) under the local spec; the up projections are
 * split by rows, whole heads, in Hugging Face's row order.
 */
static refit_status_t refit_build_megatron_mla(refit_catalog_builder_t *b, const char *p,
                                               int stage, const refit_layer_src_t *ls) {
  const int te = b->cat->trainer.spec == REFIT_SPEC_TE;
  const refit_split_t down = te ? REFIT_SPLIT_NONE : REFIT_SPLIT_ROWS;
  char name[REFIT_NAME_MAX];
  int32_t idx;

  refit_name_fmt(name, "%sinput_layernorm.weight", p);
  REFIT_CHECK(refit_add_alias(b, &idx, ls->in_norm, stage, REFIT_SPLIT_NONE, name));
  if (ls->q_a >= 0) {
    refit_name_fmt(name, "%sself_attention.linear_q_down_proj.weight", p);
    REFIT_CHECK(refit_add_alias(b, &idx, ls->q_a, stage, down, name));
    refit_name_fmt(name, "%sself_attention.%s", p,
                   te ? "linear_q_up_proj.layer_norm_weight" : "q_layernorm.weight");
    REFIT_CHECK(refit_add_alias(b, &idx, ls->q_a_norm, stage, REFIT_SPLIT_NONE, name));
    refit_name_fmt(name, "%sself_attention.linear_q_up_proj.weight", p);
    REFIT_CHECK(refit_add_alias(b, &idx, ls->q_b, stage, REFIT_SPLIT_ROWS, name));
  } else {
    refit_name_fmt(name, "%sself_attention.linear_q_proj.weight", p);
    REFIT_CHECK(refit_add_alias(b, &idx, ls->q, stage, REFIT_SPLIT_ROWS, name));
  }
  refit_name_fmt(name, "%sself_attention.linear_kv_down_proj.weight", p);
  REFIT_CHECK(refit_add_alias(b, &idx, ls->kv_a, stage, down, name));
  refit_name_fmt(name, "%sself_attention.%s", p,
                 te ? "linear_kv_up_proj.layer_norm_weight" : "kv_layernorm.weight");
  REFIT_CHECK(refit_add_alias(b, &idx, ls->kv_a_norm, stage, REFIT_SPLIT_NONE, name));
  refit_name_fmt(name, "%sself_attention.linear_kv_up_proj.weight", p);
  return refit_add_alias(b, &idx, ls->kv_b, stage, REFIT_SPLIT_ROWS, name);
}

/*
 * The trainer tensors of one layer as Megatron-Core's GPTModel holds them
 * (named_parameters(), Megatron-LM d98e8a64; ../shared/reference/
 * framework-layouts.md). Layer numbers are local to the stage; experts are
 * numbered within their ep rank (global id = ep_rank * X/ep + k,
 * megatron/core/transformer/moe/moe_layer.py).
 */
static refit_status_t refit_build_megatron_layer(refit_catalog_builder_t *b, int l,
                                                 int stage, const refit_layer_src_t *ls) {
  refit_catalog_t *cat = b->cat;
  const refit_model_t *m = &cat->model;
  const refit_trainer_layout_t *tr = &cat->trainer;
  const int te = tr->spec == REFIT_SPEC_TE;
  const refit_family_desc_t *fam = refit_family_desc(m->family);
  const int moe = ls->moe;
  const int grouped =
      tr->experts == REFIT_EXPERTS_GROUPED || (tr->experts == REFIT_EXPERTS_AUTO && te);
  const int64_t H = m->hidden_size;
  char p[REFIT_NAME_MAX], name[REFIT_NAME_MAX];
  int32_t idx;

  refit_name_fmt(p, "%sdecoder.layers.%lld.", tr->name_prefix,
                 (long long)(l - cat->stage_first_layer[stage]));
#define REFIT_MEG_NAME(suffix) refit_name_fmt(name, "%s%s", p, suffix)

  if (fam->mla) {
    REFIT_CHECK(refit_build_megatron_mla(b, p, stage, ls));
  } else {
    REFIT_CHECK(refit_build_megatron_gqa(b, p, stage, l, ls));
  }

  REFIT_MEG_NAME("self_attention.linear_proj.weight");
  REFIT_CHECK(refit_add_alias(b, &idx, ls->o, stage, REFIT_SPLIT_COLS, name));

  /* The pre-MLP norm: fused into linear_fc1 by TE in a dense layer; a MoE
   * layer keeps its own pre_mlp_layernorm under both specs. */
  REFIT_MEG_NAME(te && !moe ? "mlp.linear_fc1.layer_norm_weight"
                            : "pre_mlp_layernorm.weight");
  REFIT_CHECK(refit_add_alias(b, &idx, ls->post_norm, stage, REFIT_SPLIT_NONE, name));

  if (!moe) {
    REFIT_MEG_NAME("mlp.linear_fc1.weight");
    REFIT_CHECK(refit_add_src(b, &idx, stage, l, REFIT_ROLE_LINEAR, REFIT_SPLIT_ROWS,
                              2 * m->intermediate_size, H, "%s", name));
    REFIT_CHECK(
        refit_add_fc1_runs(b, idx, ls->gate, ls->up, m->intermediate_size, tr->tp));
    REFIT_MEG_NAME("mlp.linear_fc2.weight");
    REFIT_CHECK(refit_add_alias(b, &idx, ls->down, stage, REFIT_SPLIT_COLS, name));
    return REFIT_OK;
  }

  REFIT_MEG_NAME("mlp.router.weight");
  REFIT_CHECK(refit_add_alias(b, &idx, ls->router, stage, REFIT_SPLIT_NONE, name));
  if (ls->expert_bias >= 0) {
    /* TopKRouter's expert_bias: a persistent FP32 buffer (register_buffer),
     * not a parameter: the caller registers it from named_buffers(). */
    REFIT_MEG_NAME("mlp.router.expert_bias");
    REFIT_CHECK(refit_add_alias(b, &idx, ls->expert_bias, stage, REFIT_SPLIT_NONE, name));
  }
  const int64_t X = m->num_experts, I = m->moe_intermediate_size;
  const int64_t local = X / tr->ep;
  for (int64_t e = 0; e < X; e++) {
    const int32_t gate = ls->expert0 + (int32_t)(3 * e);
    const long long k = (long long)(e % local);
    if (grouped)
      refit_name_fmt(name, "%smlp.experts.linear_fc1.weight%lld", p, k);
    else
      refit_name_fmt(name, "%smlp.experts.local_experts.%lld.linear_fc1.weight", p, k);
    REFIT_CHECK(refit_add_src(b, &idx, stage, l, REFIT_ROLE_EXPERT, REFIT_SPLIT_ROWS,
                              2 * I, H, "%s", name));
    refit_src_set_expert(cat, &cat->src[idx], e);
    REFIT_CHECK(refit_add_fc1_runs(b, idx, gate, gate + 1, I, tr->etp));
    if (grouped)
      refit_name_fmt(name, "%smlp.experts.linear_fc2.weight%lld", p, k);
    else
      refit_name_fmt(name, "%smlp.experts.local_experts.%lld.linear_fc2.weight", p, k);
    REFIT_CHECK(refit_add_alias(b, &idx, gate + 2, stage, REFIT_SPLIT_COLS, name));
    refit_src_set_expert(cat, &cat->src[idx], e);
  }
  if (ls->shared_gate >= 0) {
    /* SharedExpertMLP on the dense tp group (not etp): linear_fc1 keeps
     * [gate_t; up_t] per tp rank as a dense MLP does. */
    const int64_t fs = m->num_shared_experts * I;
    REFIT_MEG_NAME("mlp.shared_experts.linear_fc1.weight");
    REFIT_CHECK(refit_add_src(b, &idx, stage, l, REFIT_ROLE_LINEAR, REFIT_SPLIT_ROWS,
                              2 * fs, H, "%s", name));
    REFIT_CHECK(refit_add_fc1_runs(b, idx, ls->shared_gate, ls->shared_up, fs, tr->tp));
    REFIT_MEG_NAME("mlp.shared_experts.linear_fc2.weight");
    REFIT_CHECK(refit_add_alias(b, &idx, ls->shared_down, stage, REFIT_SPLIT_COLS, name));
  }
#undef REFIT_MEG_NAME
  return REFIT_OK;
}

/* Megatron-Core's non-layer tensors: the padded word embedding on the first
 * stage, the final norm and the output layer on the last. With tied
 * embeddings and several stages the last stage still holds output_layer
 * (a copy of the embedding, kept in sync by Megatron): accepted, never
 * read. */
refit_status_t refit_build_megatron(refit_catalog_builder_t *b,
                                    const refit_layer_src_t *ls, int32_t embed,
                                    int32_t norm, int32_t lm_head) {
  refit_catalog_t *cat = b->cat;
  const refit_trainer_layout_t *tr = &cat->trainer;
  const int pp = tr->pp;
  const int64_t H = cat->model.hidden_size, V = cat->model.vocab_size;
  const int64_t Vpad = refit_catalog_trainer_vocab(&cat->model, tr);
  char name[REFIT_NAME_MAX];
  int32_t idx;

  refit_name_fmt(name, "%sembedding.word_embeddings.weight", tr->name_prefix);
  REFIT_CHECK(refit_add_src(b, &idx, 0, -1, REFIT_ROLE_EMBED, REFIT_SPLIT_ROWS, Vpad, H,
                            "%s", name));
  REFIT_CHECK(refit_add_run(b, idx, embed, 0, 0, V));
  for (int s = 0; s < pp; s++)
    for (int64_t l = cat->stage_first_layer[s]; l < cat->stage_first_layer[s + 1]; l++)
      REFIT_CHECK(refit_build_megatron_layer(b, (int)l, s, &ls[l]));
  refit_name_fmt(name, "%sdecoder.final_layernorm.weight", tr->name_prefix);
  REFIT_CHECK(refit_add_alias(b, &idx, norm, pp - 1, REFIT_SPLIT_NONE, name));
  if (lm_head >= 0 || pp > 1) {
    refit_name_fmt(name, "%soutput_layer.weight", tr->name_prefix);
    REFIT_CHECK(refit_add_src(b, &idx, pp - 1, -1, REFIT_ROLE_LM_HEAD, REFIT_SPLIT_ROWS,
                              Vpad, H, "%s", name));
    if (lm_head >= 0)
      REFIT_CHECK(refit_add_run(b, idx, lm_head, 0, 0, V));
  }
  return REFIT_OK;
}

/*
 * The Hugging Face tensors of a layer (catalog_internal.h) as the trainer
 * holds them under those names: one per projection, norm and expert, with
 * Megatron-Core's sharding of each. Attention (GQA or MLA), norms, the dense
 * MLP and the shared experts come from tables whose rows say which family's
 * layers hold them (reshard/family.h); the routed experts from their count.
 */
#include "reshard/catalog_internal.h"
#include "reshard/family.h"

#include <stddef.h>

/* A layer's sizes, which the rows and columns of its tensors are made of. */
typedef enum {
  REFIT_DIM_ONE, /* a norm's single row */
  REFIT_DIM_H,   /* hidden_size */
  REFIT_DIM_D,   /* head_dim */
  REFIT_DIM_QD,  /* query heads x head_dim */
  REFIT_DIM_KVD, /* key/value heads x head_dim */
  REFIT_DIM_F,   /* intermediate_size (dense MLP) */
  REFIT_DIM_QR,  /* q_lora_rank (MLA) */
  REFIT_DIM_KVR, /* kv_lora_rank */
  REFIT_DIM_KVA, /* kv_lora_rank + the rope head dimension R: [latent; k_rope] */
  REFIT_DIM_QH,  /* heads x (qk_nope_head_dim + R): q per head [nope; rope] */
  REFIT_DIM_KVB, /* heads x (qk_nope_head_dim + v_head_dim): [k_nope; v] per head */
  REFIT_DIM_OV,  /* heads x v_head_dim: o_proj's input */
  REFIT_DIM_FS,  /* num_shared_experts x moe_intermediate_size */
  REFIT_NDIMS
} refit_layer_dim_t;

/* Which layers hold a tensor: every family's, or only those of families
 * whose row of reshard/family.h sets the flag. */
typedef enum {
  REFIT_IN_ALL = 0,
  REFIT_IN_QK_NORM,     /* refit_family_desc_t.qk_norm */
  REFIT_IN_QKV_BIAS,    /* refit_family_desc_t.qkv_bias */
  REFIT_IN_GQA,         /* not mla: q/k/v heads */
  REFIT_IN_MLA,         /* mla */
  REFIT_IN_MLA_QLORA,   /* mla with q_lora_rank: q_a_proj, q_a_layernorm, q_b_proj */
  REFIT_IN_MLA_NO_QLORA /* mla without it (V2-Lite): q_proj */
} refit_layer_in_t;

/* One trainer tensor of a layer under its Hugging Face name
 * model.layers.<l>.<suffix>; `field` is its index in refit_layer_src_t. */
typedef struct {
  size_t field;
  refit_role_t role;
  refit_split_t split;
  refit_layer_dim_t rows, cols;
  refit_layer_in_t in;
  const char *suffix;
} refit_layer_tensor_t;

/* A row of the tables below: field of refit_layer_src_t, role, split, rows,
 * cols, the families that hold it, name suffix. A bias [n] is the column
 * [n, 1], split by rows as its weight (catalog.h). */
#define REFIT_LAYER_TENSOR(field, role, split, rows, cols, in, suffix)                   \
  {                                                                                      \
    offsetof(refit_layer_src_t, field), REFIT_ROLE_##role, REFIT_SPLIT_##split,          \
        REFIT_DIM_##rows, REFIT_DIM_##cols, REFIT_IN_##in, suffix                        \
  }

/* Attention and norms, in the order of every layer. */
static const refit_layer_tensor_t refit_layer_attention[] = {
    REFIT_LAYER_TENSOR(in_norm, NORM, NONE, ONE, H, ALL, "input_layernorm.weight"),
    REFIT_LAYER_TENSOR(q, LINEAR, ROWS, QD, H, GQA, "self_attn.q_proj.weight"),
    REFIT_LAYER_TENSOR(k, LINEAR, ROWS, KVD, H, GQA, "self_attn.k_proj.weight"),
    REFIT_LAYER_TENSOR(v, LINEAR, ROWS, KVD, H, GQA, "self_attn.v_proj.weight"),
    REFIT_LAYER_TENSOR(q_bias, BIAS, ROWS, QD, ONE, QKV_BIAS, "self_attn.q_proj.bias"),
    REFIT_LAYER_TENSOR(k_bias, BIAS, ROWS, KVD, ONE, QKV_BIAS, "self_attn.k_proj.bias"),
    REFIT_LAYER_TENSOR(v_bias, BIAS, ROWS, KVD, ONE, QKV_BIAS, "self_attn.v_proj.bias"),
    /* MLA (model-families.md 3.1): the down projections are replicated
     * (Megatron's TE spec duplicates them), the up projections split by
     * whole heads, o_proj by columns. */
    REFIT_LAYER_TENSOR(q_a, LINEAR, NONE, QR, H, MLA_QLORA, "self_attn.q_a_proj.weight"),
    REFIT_LAYER_TENSOR(q_a_norm, NORM, NONE, ONE, QR, MLA_QLORA,
                       "self_attn.q_a_layernorm.weight"),
    REFIT_LAYER_TENSOR(q_b, LINEAR, ROWS, QH, QR, MLA_QLORA, "self_attn.q_b_proj.weight"),
    REFIT_LAYER_TENSOR(q, LINEAR, ROWS, QH, H, MLA_NO_QLORA, "self_attn.q_proj.weight"),
    REFIT_LAYER_TENSOR(kv_a, LINEAR, NONE, KVA, H, MLA,
                       "self_attn.kv_a_proj_with_mqa.weight"),
    REFIT_LAYER_TENSOR(kv_a_norm, NORM, NONE, ONE, KVR, MLA,
                       "self_attn.kv_a_layernorm.weight"),
    REFIT_LAYER_TENSOR(kv_b, LINEAR, ROWS, KVB, KVR, MLA, "self_attn.kv_b_proj.weight"),
    REFIT_LAYER_TENSOR(o, LINEAR, COLS, H, QD, GQA, "self_attn.o_proj.weight"),
    REFIT_LAYER_TENSOR(o, LINEAR, COLS, H, OV, MLA, "self_attn.o_proj.weight"),
    REFIT_LAYER_TENSOR(q_norm, NORM, NONE, ONE, D, QK_NORM, "self_attn.q_norm.weight"),
    REFIT_LAYER_TENSOR(k_norm, NORM, NONE, ONE, D, QK_NORM, "self_attn.k_norm.weight"),
    REFIT_LAYER_TENSOR(post_norm, NORM, NONE, ONE, H, ALL,
                       "post_attention_layernorm.weight"),
};

/* The dense MLP (every family without experts). */
static const refit_layer_tensor_t refit_layer_dense_mlp[] = {
    REFIT_LAYER_TENSOR(gate, LINEAR, ROWS, F, H, ALL, "mlp.gate_proj.weight"),
    REFIT_LAYER_TENSOR(up, LINEAR, ROWS, F, H, ALL, "mlp.up_proj.weight"),
    REFIT_LAYER_TENSOR(down, LINEAR, COLS, H, F, ALL, "mlp.down_proj.weight"),
};

/* DeepSeek's shared experts: one MLP of num_shared_experts x
 * moe_intermediate_size rows, split over the dense tp group. */
static const refit_layer_tensor_t refit_layer_shared_experts[] = {
    REFIT_LAYER_TENSOR(shared_gate, LINEAR, ROWS, FS, H, ALL,
                       "mlp.shared_experts.gate_proj.weight"),
    REFIT_LAYER_TENSOR(shared_up, LINEAR, ROWS, FS, H, ALL,
                       "mlp.shared_experts.up_proj.weight"),
    REFIT_LAYER_TENSOR(shared_down, LINEAR, COLS, H, FS, ALL,
                       "mlp.shared_experts.down_proj.weight"),
};
#undef REFIT_LAYER_TENSOR

/* Does a layer of model m hold the tensors of condition `in`? */
static int refit_layer_holds(const refit_model_t *m, refit_layer_in_t in) {
  const refit_family_desc_t *fam = refit_family_desc(m->family);
  switch (in) {
  case REFIT_IN_ALL:
    return 1;
  case REFIT_IN_QK_NORM:
    return fam->qk_norm;
  case REFIT_IN_QKV_BIAS:
    return fam->qkv_bias;
  case REFIT_IN_GQA:
    return !fam->mla;
  case REFIT_IN_MLA:
    return fam->mla;
  case REFIT_IN_MLA_QLORA:
    return fam->mla && m->q_lora_rank > 0;
  case REFIT_IN_MLA_NO_QLORA:
    return fam->mla && m->q_lora_rank == 0;
  }
  return 0;
}

/* Append the tensors of `table` that the family's layers hold for layer l,
 * their indices into `ls` (a field no row of the table fills for this
 * family stays -1). */
static refit_status_t refit_add_layer_tensors(refit_catalog_builder_t *b, int l,
                                              int stage, const int64_t *dims,
                                              const refit_layer_tensor_t *table, size_t n,
                                              refit_layer_src_t *ls) {
  for (size_t i = 0; i < n; i++)
    *(int32_t *)(void *)((char *)ls + table[i].field) = -1;
  for (size_t i = 0; i < n; i++) {
    const refit_layer_tensor_t *t = &table[i];
    int32_t *index = (int32_t *)(void *)((char *)ls + t->field);
    if (!refit_layer_holds(&b->cat->model, t->in))
      continue;
    REFIT_CHECK(refit_add_src(b, index, stage, l, t->role, t->split, dims[t->rows],
                              dims[t->cols], "model.layers.%d.%s", l, t->suffix));
  }
  return REFIT_OK;
}

#define REFIT_LAYER_TABLE(table) table, sizeof(table) / sizeof(table[0])

refit_status_t refit_build_src_layer(refit_catalog_builder_t *b, int l, int stage,
                                     refit_layer_src_t *ls) {
  const refit_model_t *m = &b->cat->model;
  const int64_t H = m->hidden_size, D = m->head_dim, N = m->num_attention_heads;
  const int64_t dims[REFIT_NDIMS] = {
      [REFIT_DIM_ONE] = 1,
      [REFIT_DIM_H] = H,
      [REFIT_DIM_D] = D,
      [REFIT_DIM_QD] = N * D,
      [REFIT_DIM_KVD] = m->num_kv_heads * D,
      [REFIT_DIM_F] = m->intermediate_size,
      [REFIT_DIM_QR] = m->q_lora_rank,
      [REFIT_DIM_KVR] = m->kv_lora_rank,
      [REFIT_DIM_KVA] = m->kv_lora_rank + D,
      [REFIT_DIM_QH] = N * (m->qk_nope_head_dim + D),
      [REFIT_DIM_KVB] = N * (m->qk_nope_head_dim + m->v_head_dim),
      [REFIT_DIM_OV] = N * m->v_head_dim,
      [REFIT_DIM_FS] = m->num_shared_experts * m->moe_intermediate_size,
  };
  const char *p = "model.layers";

  REFIT_CHECK(refit_add_layer_tensors(b, l, stage, dims,
                                      REFIT_LAYER_TABLE(refit_layer_attention), ls));
  ls->moe = refit_layer_is_moe(m, l);
  ls->router = ls->expert0 = ls->shared_gate = ls->shared_up = ls->shared_down = -1;
  ls->expert_bias = -1;
  if (!ls->moe)
    return refit_add_layer_tensors(b, l, stage, dims,
                                   REFIT_LAYER_TABLE(refit_layer_dense_mlp), ls);
  ls->gate = ls->up = ls->down = -1;
  const int64_t X = m->num_experts, I = m->moe_intermediate_size;
  REFIT_CHECK(refit_add_src(b, &ls->router, stage, l, REFIT_ROLE_ROUTER, REFIT_SPLIT_NONE,
                            X, H, "%s.%d.mlp.gate.weight", p, l));
  ls->expert_bias = -1;
  if (m->expert_bias && refit_family_desc(m->family)->deepseek_moe)
    /* FP32 [X] in 2-byte units (catalog.h REFIT_ROLE_F32). */
    REFIT_CHECK(refit_add_src(b, &ls->expert_bias, stage, l, REFIT_ROLE_F32,
                              REFIT_SPLIT_NONE, 1, 2 * X,
                              "%s.%d.mlp.gate.e_score_correction_bias", p, l));
  ls->expert0 = (int32_t)b->cat->nsrc;
  for (int64_t e = 0; e < X; e++) {
    static const char *const names[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int w = 0; w < 3; w++) {
      int32_t idx;
      const int down = w == 2;
      REFIT_CHECK(refit_add_src(b, &idx, stage, l, REFIT_ROLE_EXPERT,
                                down ? REFIT_SPLIT_COLS : REFIT_SPLIT_ROWS, down ? H : I,
                                down ? I : H, "%s.%d.mlp.experts.%lld.%s.weight", p, l,
                                (long long)e, names[w]));
      refit_src_set_expert(b->cat, &b->cat->src[idx], e);
    }
  }
  if (m->num_shared_experts > 0 && refit_family_desc(m->family)->deepseek_moe)
    REFIT_CHECK(refit_add_layer_tensors(
        b, l, stage, dims, REFIT_LAYER_TABLE(refit_layer_shared_experts), ls));
  return REFIT_OK;
}

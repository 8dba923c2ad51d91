/*
 * The Hugging Face tensors of a layer (catalog_internal.h) as the trainer
 * holds them under those names: one per projection, norm and expert, with
 * Megatron-Core's sharding of each. Attention, norms and the dense MLP come
 * from tables whose rows say which family's layers hold them
 * (reshard/family.h); the experts from their count.
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
  REFIT_NDIMS
} refit_layer_dim_t;

/* Which layers hold a tensor: every family's, or only those of families
 * whose row of reshard/family.h sets the flag. */
typedef enum {
  REFIT_IN_ALL = 0,
  REFIT_IN_QK_NORM, /* refit_family_desc_t.qk_norm */
  REFIT_IN_QKV_BIAS /* refit_family_desc_t.qkv_bias */
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
    REFIT_LAYER_TENSOR(q, LINEAR, ROWS, QD, H, ALL, "self_attn.q_proj.weight"),
    REFIT_LAYER_TENSOR(k, LINEAR, ROWS, KVD, H, ALL, "self_attn.k_proj.weight"),
    REFIT_LAYER_TENSOR(v, LINEAR, ROWS, KVD, H, ALL, "self_attn.v_proj.weight"),
    REFIT_LAYER_TENSOR(q_bias, BIAS, ROWS, QD, ONE, QKV_BIAS, "self_attn.q_proj.bias"),
    REFIT_LAYER_TENSOR(k_bias, BIAS, ROWS, KVD, ONE, QKV_BIAS, "self_attn.k_proj.bias"),
    REFIT_LAYER_TENSOR(v_bias, BIAS, ROWS, KVD, ONE, QKV_BIAS, "self_attn.v_proj.bias"),
    REFIT_LAYER_TENSOR(o, LINEAR, COLS, H, QD, ALL, "self_attn.o_proj.weight"),
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
#undef REFIT_LAYER_TENSOR

/* Append the tensors of `table` that the family's layers hold for layer l,
 * their indices into `ls` (-1 for those it does not hold). */
static refit_status_t refit_add_layer_tensors(refit_catalog_builder_t *b, int l,
                                              int stage, const int64_t *dims,
                                              const refit_layer_tensor_t *table, size_t n,
                                              refit_layer_src_t *ls) {
  const refit_family_desc_t *fam = refit_family_desc(b->cat->model.family);
  for (size_t i = 0; i < n; i++) {
    const refit_layer_tensor_t *t = &table[i];
    int32_t *index = (int32_t *)(void *)((char *)ls + t->field);
    const int held = t->in == REFIT_IN_ALL ||
                     (t->in == REFIT_IN_QK_NORM && fam->qk_norm) ||
                     (t->in == REFIT_IN_QKV_BIAS && fam->qkv_bias);
    *index = -1;
    if (!held)
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
  const int64_t H = m->hidden_size, D = m->head_dim;
  const int64_t dims[REFIT_NDIMS] = {
      [REFIT_DIM_ONE] = 1,
      [REFIT_DIM_H] = H,
      [REFIT_DIM_D] = D,
      [REFIT_DIM_QD] = m->num_attention_heads * D,
      [REFIT_DIM_KVD] = m->num_kv_heads * D,
      [REFIT_DIM_F] = m->intermediate_size,
  };
  const char *p = "model.layers";

  REFIT_CHECK(refit_add_layer_tensors(b, l, stage, dims,
                                      REFIT_LAYER_TABLE(refit_layer_attention), ls));
  if (!refit_family_desc(m->family)->moe)
    return refit_add_layer_tensors(b, l, stage, dims,
                                   REFIT_LAYER_TABLE(refit_layer_dense_mlp), ls);
  const int64_t X = m->num_experts, I = m->moe_intermediate_size;
  REFIT_CHECK(refit_add_src(b, &ls->router, stage, l, REFIT_ROLE_ROUTER, REFIT_SPLIT_NONE,
                            X, H, "%s.%d.mlp.gate.weight", p, l));
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
  return REFIT_OK;
}

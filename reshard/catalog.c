/*
 * Catalog construction: Megatron-Core sharding of the HF-named parameters on
 * the trainer side, vLLM runtime tensors on the generator side. The rules are
 * those of ../shared/reference/sharding.md; each function below names the
 * rule it implements.
 */
#include "reshard/catalog.h"

#include "core/error.h"
#include "core/hash.h"
#include "reshard/rules.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  refit_catalog_t *cat;
  int64_t src_cap, gen_cap, seg_cap, run_cap;
  int64_t ngen;
} refit_catalog_builder_t;

static refit_status_t refit_catalog_index(refit_catalog_t *cat);

/* vLLM's VocabParallelEmbedding and ParallelLMHead pad the vocabulary to a
 * multiple of 64 (DEFAULT_VOCAB_PADDING_SIZE, vllm 0.25
 * model_executor/layers/vocab_parallel_embedding.py) and give each tp rank
 * an equal share of the padded rows; the padding rows hold zeros. */
#define REFIT_VLLM_VOCAB_PADDING 64

static int64_t refit_round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

int64_t refit_catalog_vocab_rows(const refit_model_t *m, int gen_tp) {
  return refit_round_up(m->vocab_size, REFIT_VLLM_VOCAB_PADDING) / gen_tp;
}

/* Megatron-Core pads the vocabulary to a multiple of
 * make_vocab_size_divisible_by * tp (megatron/training/tokenizer
 * _vocab_size_with_padding, Megatron-LM d98e8a64). */
int64_t refit_catalog_trainer_vocab(const refit_model_t *m,
                                    const refit_trainer_layout_t *t) {
  if (t->names != REFIT_TRAINER_NAMES_MEGATRON)
    return m->vocab_size;
  const int64_t div = t->vocab_divisible_by > 0 ? t->vocab_divisible_by : 128;
  return refit_round_up(m->vocab_size, div * t->tp);
}

static refit_status_t refit_catalog_grow(void **ptr, int64_t *cap, int64_t need,
                                         size_t elem) {
  if (need <= *cap)
    return REFIT_OK;
  int64_t ncap = *cap ? *cap : 256;
  while (ncap < need)
    ncap *= 2;
  void *np = realloc(*ptr, (size_t)ncap * elem);
  if (np == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY,
                     "catalog: cannot grow a table to %lld entries",
                     (long long)ncap);
  *ptr = np;
  *cap = ncap;
  return REFIT_OK;
}

static void refit_name_fmt(char *dst, const char *fmt, ...) REFIT_PRINTF(2, 3);
static void refit_name_fmt(char *dst, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(dst, REFIT_NAME_MAX, fmt, ap);
  va_end(ap);
}

/* The layout rules (rules.c) as one error: the first broken rule. */
static refit_status_t refit_layout_check(const refit_model_t *m,
                                         const refit_trainer_layout_t *t,
                                         const refit_generator_layout_t *g) {
  refit_violations_t v;
  refit_layout_rules(m, t, g, 0, &v);
  if (v.count == 0)
    return REFIT_OK;
  return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "layout: %s%s", v.v[0].text,
                   v.count + v.dropped > 1 ? " (and other broken layout rules)" : "");
}

/* Append a trainer tensor. Dense tensors are split over the tp ranks of their
 * stage with dp replicas; replicated ones are held by all tp*dp ranks. */
static refit_status_t refit_add_src(refit_catalog_builder_t *b, int32_t *index,
                                    int stage, int32_t layer, refit_role_t role,
                                    refit_split_t split, int64_t rows,
                                    int64_t cols, const char *fmt, ...)
    REFIT_PRINTF(9, 10);
static refit_status_t refit_add_src(refit_catalog_builder_t *b, int32_t *index,
                                    int stage, int32_t layer, refit_role_t role,
                                    refit_split_t split, int64_t rows,
                                    int64_t cols, const char *fmt, ...) {
  refit_catalog_t *cat = b->cat;
  REFIT_CHECK(refit_catalog_grow((void **)&cat->src, &b->src_cap, cat->nsrc + 1,
                                 sizeof(*cat->src)));
  refit_src_tensor_t *t = &cat->src[cat->nsrc];
  memset(t, 0, sizeof(*t));
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->name, REFIT_NAME_MAX, fmt, ap);
  va_end(ap);
  t->rows = rows;
  t->cols = cols;
  t->role = role;
  t->split = split;
  t->stage = stage;
  t->layer = layer;
  t->base = 0;
  t->part_stride = 1;
  if (split == REFIT_SPLIT_NONE) {
    t->nparts = 1;
    t->nreplicas = cat->ranks_per_stage;
    t->replica_stride = 1;
  } else {
    t->nparts = cat->trainer.tp;
    t->nreplicas = cat->trainer.dp;
    t->replica_stride = cat->trainer.tp;
  }
  *index = (int32_t)cat->nsrc++;
  return REFIT_OK;
}

/* Megatron MoE parallel folding: the tp*dp ranks of a stage are viewed as
 * etp (fastest) x ep x edp; expert e lives on ep rank e / (X / ep). */
static void refit_src_set_expert(const refit_catalog_t *cat,
                                 refit_src_tensor_t *t, int64_t expert) {
  const refit_trainer_layout_t *tr = &cat->trainer;
  int64_t ep_rank = expert / (cat->model.num_experts / tr->ep);
  t->nparts = tr->etp;
  t->nreplicas = cat->ranks_per_stage / (tr->etp * tr->ep);
  t->base = (int32_t)(tr->etp * ep_rank);
  t->part_stride = 1;
  t->replica_stride = tr->etp * tr->ep;
  if (tr->etp == 1)
    t->split = REFIT_SPLIT_NONE;
}

static refit_status_t refit_add_gen(refit_catalog_builder_t *b,
                                    refit_gen_tensor_t **out, int32_t layer,
                                    refit_role_t role, refit_gen_kind_t kind,
                                    int ndim, int64_t d0, int64_t d1, int64_t d2,
                                    const char *name) {
  refit_catalog_t *cat = b->cat;
  int64_t n = b->ngen;
  REFIT_CHECK(refit_catalog_grow((void **)&cat->gen, &b->gen_cap, n + 1,
                                 sizeof(*cat->gen)));
  refit_gen_tensor_t *g = &cat->gen[n];
  memset(g, 0, sizeof(*g));
  snprintf(g->name, REFIT_NAME_MAX, "%s", name);
  g->ndim = ndim;
  g->shape[0] = d0;
  g->shape[1] = d1;
  g->shape[2] = d2;
  g->cols = ndim == 1 ? d0 : (ndim == 2 ? d1 : d2);
  g->rows = ndim == 1 ? 1 : (ndim == 2 ? d0 : d0 * d1);
  g->kind = kind;
  g->role = role;
  g->layer = layer;
  g->seg_begin = cat->nsegs;
  b->ngen++;
  *out = g;
  return REFIT_OK;
}

/* Rows [src_row, +rows) of trainer tensor `src` are rows [hf_row, +rows)
 * of Hugging Face tensor `hf`. */
static refit_status_t refit_add_run(refit_catalog_builder_t *b, int32_t src,
                                    int32_t hf, int64_t src_row, int64_t hf_row,
                                    int64_t rows) {
  refit_catalog_t *cat = b->cat;
  REFIT_CHECK(refit_catalog_grow((void **)&cat->runs, &b->run_cap, cat->nruns + 1,
                                 sizeof(*cat->runs)));
  refit_row_run_t *r = &cat->runs[cat->nruns];
  r->src = src;
  r->hf = hf;
  r->src_row = src_row;
  r->hf_row = hf_row;
  r->rows = rows;
  refit_src_tensor_t *t = &cat->src[src];
  if (t->run_count == 0)
    t->run_begin = cat->nruns;
  t->run_count++;
  cat->nruns++;
  return REFIT_OK;
}

/*
 * Place rows [hf_row, +rows) x cols [col, +cols) of Hugging Face tensor `hf`
 * at (dst_row, dst_col) of runtime tensor g: one segment per trainer-tensor
 * run that holds a part of those rows (one with trainer.names hf; with
 * megatron, a fused tensor's rows come in several runs).
 */
static refit_status_t refit_add_seg(refit_catalog_builder_t *b,
                                    refit_gen_tensor_t *g, int32_t hf,
                                    int64_t hf_row, int64_t col, int64_t rows,
                                    int64_t cols, int64_t dst_row,
                                    int64_t dst_col) {
  refit_catalog_t *cat = b->cat;
  int64_t covered = 0;
  for (int64_t k = cat->hf_run_begin[hf]; k < cat->hf_run_begin[hf + 1]; k++) {
    const refit_row_run_t *r = &cat->runs[cat->hf_runs[k]];
    const int64_t lo = r->hf_row > hf_row ? r->hf_row : hf_row;
    const int64_t hi = r->hf_row + r->rows < hf_row + rows ? r->hf_row + r->rows
                                                           : hf_row + rows;
    if (hi <= lo)
      continue;
    REFIT_CHECK(refit_catalog_grow((void **)&cat->segs, &b->seg_cap,
                                   cat->nsegs + 1, sizeof(*cat->segs)));
    refit_segment_t *s = &cat->segs[cat->nsegs++];
    s->src = r->src;
    s->src_row = r->src_row + (lo - r->hf_row);
    s->src_col = col;
    s->rows = hi - lo;
    s->cols = cols;
    s->dst_row = dst_row + (lo - hf_row);
    s->dst_col = dst_col;
    g->seg_count++;
    g->elements += (hi - lo) * cols;
    covered += hi - lo;
  }
  if (covered != rows)
    return REFIT_ERR(REFIT_ERR_INTERNAL,
                     "catalog: %lld of %lld rows of %s for %s are held by no "
                     "trainer tensor",
                     (long long)(rows - covered), (long long)rows,
                     cat->hf[hf].name, g->name);
  return REFIT_OK;
}

/* Trainer tensor indices of one layer, filled by refit_build_src_layer. */
typedef struct {
  int32_t in_norm, post_norm, q, k, v, o, q_norm, k_norm;
  int32_t gate, up, down, router;
  int32_t expert0; /* first of 3 * X expert tensors: gate, up, down per e */
} refit_layer_src_t;

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

/* One trainer tensor of a layer under its Hugging Face name
 * model.layers.<l>.<suffix>; `field` is its index in refit_layer_src_t. */
typedef struct {
  size_t field;
  refit_role_t role;
  refit_split_t split;
  refit_layer_dim_t rows, cols;
  const char *suffix;
} refit_layer_tensor_t;

/* A row of the tables below: field of refit_layer_src_t, role, split, rows,
 * cols, name suffix. */
#define REFIT_LAYER_TENSOR(field, role, split, rows, cols, suffix)                       \
  {                                                                                      \
    offsetof(refit_layer_src_t, field), REFIT_ROLE_##role, REFIT_SPLIT_##split,          \
        REFIT_DIM_##rows, REFIT_DIM_##cols, suffix                                       \
  }

/* Attention and norms, in the order of every layer. */
static const refit_layer_tensor_t refit_layer_attention[] = {
    REFIT_LAYER_TENSOR(in_norm, NORM, NONE, ONE, H, "input_layernorm.weight"),
    REFIT_LAYER_TENSOR(q, LINEAR, ROWS, QD, H, "self_attn.q_proj.weight"),
    REFIT_LAYER_TENSOR(k, LINEAR, ROWS, KVD, H, "self_attn.k_proj.weight"),
    REFIT_LAYER_TENSOR(v, LINEAR, ROWS, KVD, H, "self_attn.v_proj.weight"),
    REFIT_LAYER_TENSOR(o, LINEAR, COLS, H, QD, "self_attn.o_proj.weight"),
    REFIT_LAYER_TENSOR(q_norm, NORM, NONE, ONE, D, "self_attn.q_norm.weight"),
    REFIT_LAYER_TENSOR(k_norm, NORM, NONE, ONE, D, "self_attn.k_norm.weight"),
    REFIT_LAYER_TENSOR(post_norm, NORM, NONE, ONE, H, "post_attention_layernorm.weight"),
};

/* The dense MLP (qwen3). */
static const refit_layer_tensor_t refit_layer_dense_mlp[] = {
    REFIT_LAYER_TENSOR(gate, LINEAR, ROWS, F, H, "mlp.gate_proj.weight"),
    REFIT_LAYER_TENSOR(up, LINEAR, ROWS, F, H, "mlp.up_proj.weight"),
    REFIT_LAYER_TENSOR(down, LINEAR, COLS, H, F, "mlp.down_proj.weight"),
};
#undef REFIT_LAYER_TENSOR

/* Append the tensors of `table` for layer l, their indices into `ls`. */
static refit_status_t refit_add_layer_tensors(refit_catalog_builder_t *b, int l,
                                              int stage, const int64_t *dims,
                                              const refit_layer_tensor_t *table, size_t n,
                                              refit_layer_src_t *ls) {
  for (size_t i = 0; i < n; i++) {
    const refit_layer_tensor_t *t = &table[i];
    int32_t *index = (int32_t *)(void *)((char *)ls + t->field);
    REFIT_CHECK(refit_add_src(b, index, stage, l, t->role, t->split, dims[t->rows],
                              dims[t->cols], "model.layers.%d.%s", l, t->suffix));
  }
  return REFIT_OK;
}

#define REFIT_LAYER_TABLE(table) table, sizeof(table) / sizeof(table[0])

static refit_status_t refit_build_src_layer(refit_catalog_builder_t *b, int l,
                                            int stage, refit_layer_src_t *ls) {
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
  if (m->family == REFIT_FAMILY_QWEN3)
    return refit_add_layer_tensors(b, l, stage, dims,
                                   REFIT_LAYER_TABLE(refit_layer_dense_mlp), ls);
  const int64_t X = m->num_experts, I = m->moe_intermediate_size;
  REFIT_CHECK(refit_add_src(b, &ls->router, stage, l, REFIT_ROLE_ROUTER,
                            REFIT_SPLIT_NONE, X, H, "%s.%d.mlp.gate.weight", p,
                            l));
  ls->expert0 = (int32_t)b->cat->nsrc;
  for (int64_t e = 0; e < X; e++) {
    static const char *const names[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int w = 0; w < 3; w++) {
      int32_t idx;
      const int down = w == 2;
      REFIT_CHECK(refit_add_src(
          b, &idx, stage, l, REFIT_ROLE_EXPERT,
          down ? REFIT_SPLIT_COLS : REFIT_SPLIT_ROWS, down ? H : I,
          down ? I : H, "%s.%d.mlp.experts.%lld.%s.weight", p, l, (long long)e,
          names[w]));
      refit_src_set_expert(b->cat, &b->cat->src[idx], e);
    }
  }
  return REFIT_OK;
}

/*
 * Generator tensors of one layer for tp rank t (vLLM):
 * qkv_proj = [q_t; k_t; v_t] with KV-head replication when tp > KV,
 * o_proj split on dim 1, gate_up_proj = [gate_t; up_t], down_proj on dim 1,
 * experts w13 = [gate; up] per expert and w2, TP-sharded (ep 1) or split
 * over ranks (ep tp), router and norms replicated.
 */
static refit_status_t refit_build_gen_layer(refit_catalog_builder_t *b, int l,
                                            int t, const refit_layer_src_t *ls) {
  const refit_model_t *m = &b->cat->model;
  const int gtp = b->cat->generator.tp;
  const int64_t H = m->hidden_size, D = m->head_dim;
  const int64_t q_rows = m->num_attention_heads / gtp * D;
  int64_t kv_rows, kv_row0;
  char name[REFIT_NAME_MAX];
  refit_gen_tensor_t *g;

  if (gtp <= m->num_kv_heads) {
    kv_rows = m->num_kv_heads / gtp * D;
    kv_row0 = t * kv_rows;
  } else {
    int64_t share = gtp / m->num_kv_heads; /* ranks sharing one KV head */
    kv_rows = D;
    kv_row0 = (t / share) * D;
  }

#define REFIT_GEN(layer_name, role, kind, nd, d0, d1, d2)                      \
  do {                                                                         \
    refit_name_fmt(name, "model.layers.%d.%s", l, layer_name);                 \
    REFIT_CHECK(refit_add_gen(b, &g, l, role, kind, nd, d0, d1, d2, name));    \
  } while (0)

  REFIT_GEN("input_layernorm.weight", REFIT_ROLE_NORM, REFIT_GEN_PLAIN, 1, H, 0, 0);
  REFIT_CHECK(refit_add_seg(b, g, ls->in_norm, 0, 0, 1, H, 0, 0));

  REFIT_GEN("self_attn.qkv_proj.weight", REFIT_ROLE_LINEAR, REFIT_GEN_LINEAR, 2,
            q_rows + 2 * kv_rows, H, 0);
  g->k_field = REFIT_FIELD_MODEL_HIDDEN_SIZE;
  REFIT_CHECK(refit_add_seg(b, g, ls->q, t * q_rows, 0, q_rows, H, 0, 0));
  REFIT_CHECK(refit_add_seg(b, g, ls->k, kv_row0, 0, kv_rows, H, q_rows, 0));
  REFIT_CHECK(refit_add_seg(b, g, ls->v, kv_row0, 0, kv_rows, H,
                            q_rows + kv_rows, 0));

  REFIT_GEN("self_attn.o_proj.weight", REFIT_ROLE_LINEAR, REFIT_GEN_LINEAR, 2, H,
            q_rows, 0);
  g->k_field = REFIT_FIELD_MODEL_HEAD_DIM;
  REFIT_CHECK(refit_add_seg(b, g, ls->o, 0, t * q_rows, H, q_rows, 0, 0));

  REFIT_GEN("self_attn.q_norm.weight", REFIT_ROLE_NORM, REFIT_GEN_PLAIN, 1, D, 0, 0);
  REFIT_CHECK(refit_add_seg(b, g, ls->q_norm, 0, 0, 1, D, 0, 0));
  REFIT_GEN("self_attn.k_norm.weight", REFIT_ROLE_NORM, REFIT_GEN_PLAIN, 1, D, 0, 0);
  REFIT_CHECK(refit_add_seg(b, g, ls->k_norm, 0, 0, 1, D, 0, 0));

  REFIT_GEN("post_attention_layernorm.weight", REFIT_ROLE_NORM, REFIT_GEN_PLAIN,
            1, H, 0, 0);
  REFIT_CHECK(refit_add_seg(b, g, ls->post_norm, 0, 0, 1, H, 0, 0));

  if (m->family == REFIT_FAMILY_QWEN3) {
    const int64_t f = m->intermediate_size / gtp;
    REFIT_GEN("mlp.gate_up_proj.weight", REFIT_ROLE_LINEAR, REFIT_GEN_LINEAR, 2,
              2 * f, H, 0);
    g->k_field = REFIT_FIELD_MODEL_HIDDEN_SIZE;
    REFIT_CHECK(refit_add_seg(b, g, ls->gate, t * f, 0, f, H, 0, 0));
    REFIT_CHECK(refit_add_seg(b, g, ls->up, t * f, 0, f, H, f, 0));
    REFIT_GEN("mlp.down_proj.weight", REFIT_ROLE_LINEAR, REFIT_GEN_LINEAR, 2, H,
              f, 0);
    g->k_field = REFIT_FIELD_MODEL_INTERMEDIATE_SIZE;
    REFIT_CHECK(refit_add_seg(b, g, ls->down, 0, t * f, H, f, 0, 0));
    return REFIT_OK;
  }

  const int64_t X = m->num_experts, I = m->moe_intermediate_size;
  const int ep = b->cat->generator.ep;
  const int64_t E = ep == 1 ? X : X / gtp;   /* local experts */
  const int64_t i = ep == 1 ? I / gtp : I;    /* intermediate rows per rank */
  const int64_t e0 = ep == 1 ? 0 : t * E;     /* first global expert */
  const int64_t i0 = ep == 1 ? t * i : 0;     /* first intermediate row */

  /* vLLM builds the router as ReplicatedLinear with quant_config=None
   * (model_executor/models/qwen3_moe.py, Qwen3MoeSparseMoeBlock): BF16 under
   * every quantization. */
  REFIT_GEN("mlp.gate.weight", REFIT_ROLE_ROUTER, REFIT_GEN_PLAIN, 2, X, H, 0);
  REFIT_CHECK(refit_add_seg(b, g, ls->router, 0, 0, X, H, 0, 0));
  REFIT_GEN("mlp.experts.w13_weight", REFIT_ROLE_EXPERT, REFIT_GEN_MOE_W13, 3,
            E, 2 * i, H);
  g->k_field = REFIT_FIELD_MODEL_HIDDEN_SIZE;
  for (int64_t e = 0; e < E; e++) {
    int32_t gate = ls->expert0 + (int32_t)(3 * (e0 + e));
    REFIT_CHECK(refit_add_seg(b, g, gate, i0, 0, i, H, e * 2 * i, 0));
    REFIT_CHECK(refit_add_seg(b, g, gate + 1, i0, 0, i, H, e * 2 * i + i, 0));
  }
  REFIT_GEN("mlp.experts.w2_weight", REFIT_ROLE_EXPERT, REFIT_GEN_MOE_W2, 3, E,
            H, i);
  g->k_field = REFIT_FIELD_MODEL_MOE_INTERMEDIATE_SIZE;
  for (int64_t e = 0; e < E; e++) {
    int32_t down = ls->expert0 + (int32_t)(3 * (e0 + e)) + 2;
    REFIT_CHECK(refit_add_seg(b, g, down, 0, i0, H, i, e * H, 0));
  }
#undef REFIT_GEN
  return REFIT_OK;
}

/* Append trainer tensor `name` holding Hugging Face tensor `hf` row for row
 * (same shape), split as `split` over the stage's tp ranks. */
static refit_status_t refit_add_alias(refit_catalog_builder_t *b, int32_t *index,
                                      int32_t hf, int stage, refit_split_t split,
                                      const char *name) {
  const refit_src_tensor_t h = b->cat->hf[hf];
  REFIT_CHECK(refit_add_src(b, index, stage, h.layer, h.role, split, h.rows,
                            h.cols, "%s", name));
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

/*
 * The trainer tensors of one layer as Megatron-Core's GPTModel holds them
 * (named_parameters(), Megatron-LM d98e8a64; ../shared/reference/
 * framework-layouts.md). Layer numbers are local to the stage; experts are
 * numbered within their ep rank (global id = ep_rank * X/ep + k,
 * megatron/core/transformer/moe/moe_layer.py).
 */
static refit_status_t refit_build_megatron_layer(refit_catalog_builder_t *b, int l,
                                                 int stage,
                                                 const refit_layer_src_t *ls) {
  refit_catalog_t *cat = b->cat;
  const refit_model_t *m = &cat->model;
  const refit_trainer_layout_t *tr = &cat->trainer;
  const int te = tr->spec == REFIT_SPEC_TE;
  const int moe = m->family == REFIT_FAMILY_QWEN3_MOE;
  const int grouped = tr->experts == REFIT_EXPERTS_GROUPED ||
                      (tr->experts == REFIT_EXPERTS_AUTO && te);
  const int64_t D = m->head_dim, H = m->hidden_size;
  const int64_t groups = m->num_kv_heads;
  const int64_t per_group = m->num_attention_heads / groups; /* q heads */
  char p[REFIT_NAME_MAX], name[REFIT_NAME_MAX];
  int32_t idx;

  refit_name_fmt(p, "%sdecoder.layers.%lld.", tr->name_prefix,
                 (long long)(l - cat->stage_first_layer[stage]));
#define REFIT_MEG_NAME(suffix) refit_name_fmt(name, "%s%s", p, suffix)

  REFIT_MEG_NAME(te ? "self_attention.linear_qkv.layer_norm_weight"
                    : "input_layernorm.weight");
  REFIT_CHECK(refit_add_alias(b, &idx, ls->in_norm, stage, REFIT_SPLIT_NONE, name));

  /* linear_qkv, globally [q..q k v] per query group: per_group query heads,
   * then the group's K head, then its V head (attention.py
   * get_query_key_value_tensors; Bridge QKVMapping). A tp rank holds a
   * contiguous 1/tp of these rows. */
  REFIT_MEG_NAME("self_attention.linear_qkv.weight");
  REFIT_CHECK(refit_add_src(b, &idx, stage, l, REFIT_ROLE_LINEAR, REFIT_SPLIT_ROWS,
                            (m->num_attention_heads + 2 * groups) * D, H, "%s",
                            name));
  for (int64_t g = 0; g < groups; g++) {
    const int64_t row0 = g * (per_group + 2) * D;
    REFIT_CHECK(refit_add_run(b, idx, ls->q, row0, g * per_group * D, per_group * D));
    REFIT_CHECK(refit_add_run(b, idx, ls->k, row0 + per_group * D, g * D, D));
    REFIT_CHECK(refit_add_run(b, idx, ls->v, row0 + (per_group + 1) * D, g * D, D));
  }
  REFIT_MEG_NAME("self_attention.q_layernorm.weight");
  REFIT_CHECK(refit_add_alias(b, &idx, ls->q_norm, stage, REFIT_SPLIT_NONE, name));
  REFIT_MEG_NAME("self_attention.k_layernorm.weight");
  REFIT_CHECK(refit_add_alias(b, &idx, ls->k_norm, stage, REFIT_SPLIT_NONE, name));
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
    REFIT_CHECK(refit_add_fc1_runs(b, idx, ls->gate, ls->up, m->intermediate_size,
                                   tr->tp));
    REFIT_MEG_NAME("mlp.linear_fc2.weight");
    REFIT_CHECK(refit_add_alias(b, &idx, ls->down, stage, REFIT_SPLIT_COLS, name));
    return REFIT_OK;
  }

  REFIT_MEG_NAME("mlp.router.weight");
  REFIT_CHECK(refit_add_alias(b, &idx, ls->router, stage, REFIT_SPLIT_NONE, name));
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
#undef REFIT_MEG_NAME
  return REFIT_OK;
}

/* Megatron-Core's non-layer tensors: the padded word embedding on the first
 * stage, the final norm and the output layer on the last. With tied
 * embeddings and several stages the last stage still holds output_layer
 * (a copy of the embedding, kept in sync by Megatron): accepted, never
 * read. */
static refit_status_t refit_build_megatron(refit_catalog_builder_t *b,
                                           const refit_layer_src_t *ls,
                                           int32_t embed, int32_t norm,
                                           int32_t lm_head) {
  refit_catalog_t *cat = b->cat;
  const refit_trainer_layout_t *tr = &cat->trainer;
  const int pp = tr->pp;
  const int64_t H = cat->model.hidden_size, V = cat->model.vocab_size;
  const int64_t Vpad = refit_catalog_trainer_vocab(&cat->model, tr);
  char name[REFIT_NAME_MAX];
  int32_t idx;

  refit_name_fmt(name, "%sembedding.word_embeddings.weight", tr->name_prefix);
  REFIT_CHECK(refit_add_src(b, &idx, 0, -1, REFIT_ROLE_EMBED, REFIT_SPLIT_ROWS, Vpad,
                            H, "%s", name));
  REFIT_CHECK(refit_add_run(b, idx, embed, 0, 0, V));
  for (int s = 0; s < pp; s++)
    for (int64_t l = cat->stage_first_layer[s]; l < cat->stage_first_layer[s + 1]; l++)
      REFIT_CHECK(refit_build_megatron_layer(b, (int)l, s, &ls[l]));
  refit_name_fmt(name, "%sdecoder.final_layernorm.weight", tr->name_prefix);
  REFIT_CHECK(refit_add_alias(b, &idx, norm, pp - 1, REFIT_SPLIT_NONE, name));
  if (lm_head >= 0 || pp > 1) {
    refit_name_fmt(name, "%soutput_layer.weight", tr->name_prefix);
    REFIT_CHECK(refit_add_src(b, &idx, pp - 1, -1, REFIT_ROLE_LM_HEAD,
                              REFIT_SPLIT_ROWS, Vpad, H, "%s", name));
    if (lm_head >= 0)
      REFIT_CHECK(refit_add_run(b, idx, lm_head, 0, 0, V));
  }
  return REFIT_OK;
}

static int refit_hf_run_cmp(const void *a, const void *b, void *ctx) {
  const refit_row_run_t *runs = ctx;
  const refit_row_run_t *x = &runs[*(const int64_t *)a], *y = &runs[*(const int64_t *)b];
  if (x->hf != y->hf)
    return x->hf < y->hf ? -1 : 1;
  return (x->hf_row > y->hf_row) - (x->hf_row < y->hf_row);
}

/* The runs of each Hugging Face tensor by row, and the check that trainer
 * tensors hold every Hugging Face row exactly once. */
static refit_status_t refit_catalog_hf_runs(refit_catalog_t *cat) {
  cat->hf_runs = malloc((size_t)(cat->nruns ? cat->nruns : 1) * sizeof(int64_t));
  cat->hf_run_begin = calloc((size_t)cat->nhf + 1, sizeof(int64_t));
  if (cat->hf_runs == NULL || cat->hf_run_begin == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "catalog: %lld row runs",
                     (long long)cat->nruns);
  for (int64_t i = 0; i < cat->nruns; i++)
    cat->hf_runs[i] = i;
  qsort_r(cat->hf_runs, (size_t)cat->nruns, sizeof(int64_t), refit_hf_run_cmp,
          cat->runs);
  for (int64_t i = 0; i < cat->nruns; i++)
    cat->hf_run_begin[cat->runs[i].hf + 1]++;
  for (int64_t h = 0; h < cat->nhf; h++)
    cat->hf_run_begin[h + 1] += cat->hf_run_begin[h];
  for (int64_t h = 0; h < cat->nhf; h++) {
    int64_t next = 0;
    for (int64_t k = cat->hf_run_begin[h]; k < cat->hf_run_begin[h + 1]; k++) {
      const refit_row_run_t *r = &cat->runs[cat->hf_runs[k]];
      if (r->hf_row != next)
        break;
      next += r->rows;
    }
    if (next != cat->hf[h].rows)
      return REFIT_ERR(REFIT_ERR_INTERNAL,
                       "catalog: trainer tensors hold rows 0..%lld of %s "
                       "contiguously, expected all %lld",
                       (long long)next, cat->hf[h].name, (long long)cat->hf[h].rows);
  }
  return REFIT_OK;
}

static refit_status_t refit_catalog_build(refit_catalog_builder_t *b) {
  refit_catalog_t *cat = b->cat;
  const refit_model_t *m = &cat->model;
  const int gtp = cat->generator.tp, pp = cat->trainer.pp;
  const int64_t H = m->hidden_size, V = m->vocab_size, L = m->num_layers;
  const int64_t Vg = refit_catalog_vocab_rows(m, gtp);
  refit_layer_src_t *ls = calloc((size_t)L, sizeof(*ls));
  int32_t embed, norm, lm_head = -1;
  refit_gen_tensor_t *g;
  refit_status_t st = REFIT_OK;

  if (ls == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "catalog: %lld layers", (long long)L);
  /* The Hugging Face tensors, with the sharding they have when the trainer
   * holds them under these names. Embedding on the first stage, final norm
   * and lm_head on the last. */
  REFIT_CHECK_GOTO(refit_add_src(b, &embed, 0, -1, REFIT_ROLE_EMBED,
                                 REFIT_SPLIT_ROWS, V, H,
                                 "model.embed_tokens.weight"),
                   st, out);
  for (int s = 0; s < pp; s++)
    for (int64_t l = cat->stage_first_layer[s]; l < cat->stage_first_layer[s + 1];
         l++)
      REFIT_CHECK_GOTO(refit_build_src_layer(b, (int)l, s, &ls[l]), st, out);
  REFIT_CHECK_GOTO(refit_add_src(b, &norm, pp - 1, -1, REFIT_ROLE_NORM,
                                 REFIT_SPLIT_NONE, 1, H, "model.norm.weight"),
                   st, out);
  if (!m->tie_word_embeddings)
    REFIT_CHECK_GOTO(refit_add_src(b, &lm_head, pp - 1, -1, REFIT_ROLE_LM_HEAD,
                                   REFIT_SPLIT_ROWS, V, H, "lm_head.weight"),
                     st, out);

  if (cat->trainer.names == REFIT_TRAINER_NAMES_MEGATRON) {
    /* The Hugging Face tensors become the model's description only; the
     * trainer holds Megatron's. */
    cat->hf = cat->src;
    cat->nhf = cat->nsrc;
    cat->src = NULL;
    cat->nsrc = 0;
    b->src_cap = 0;
    REFIT_CHECK_GOTO(refit_build_megatron(b, ls, embed, norm, lm_head), st, out);
  } else {
    cat->hf = cat->src;
    cat->nhf = cat->nsrc;
    for (int32_t i = 0; i < (int32_t)cat->nsrc; i++)
      REFIT_CHECK_GOTO(refit_add_run(b, i, i, 0, 0, cat->src[i].rows), st, out);
  }
  REFIT_CHECK_GOTO(refit_catalog_hf_runs(cat), st, out);

  for (int t = 0; t < gtp; t++) {
    /* Vocabulary rows [t * Vg, (t + 1) * Vg) of the padded vocabulary; the
     * rows past V are padding and get no segment. */
    const int64_t v0 = t * Vg < V ? t * Vg : V;
    const int64_t v1 = (t + 1) * Vg < V ? (t + 1) * Vg : V;
    cat->gen_begin[t] = b->ngen;
    REFIT_CHECK_GOTO(refit_add_gen(b, &g, -1, REFIT_ROLE_EMBED, REFIT_GEN_PLAIN,
                                   2, Vg, H, 0, "model.embed_tokens.weight"),
                     st, out);
    if (v1 > v0)
      REFIT_CHECK_GOTO(refit_add_seg(b, g, embed, v0, 0, v1 - v0, H, 0, 0), st, out);
    for (int64_t l = 0; l < L; l++)
      REFIT_CHECK_GOTO(refit_build_gen_layer(b, (int)l, t, &ls[l]), st, out);
    REFIT_CHECK_GOTO(refit_add_gen(b, &g, -1, REFIT_ROLE_NORM, REFIT_GEN_PLAIN,
                                   1, H, 0, 0, "model.norm.weight"),
                     st, out);
    REFIT_CHECK_GOTO(refit_add_seg(b, g, norm, 0, 0, 1, H, 0, 0), st, out);
    if (lm_head >= 0) {
      REFIT_CHECK_GOTO(refit_add_gen(b, &g, -1, REFIT_ROLE_LM_HEAD,
                                     REFIT_GEN_PLAIN, 2, Vg, H, 0,
                                     "lm_head.weight"),
                       st, out);
      if (v1 > v0)
        REFIT_CHECK_GOTO(refit_add_seg(b, g, lm_head, v0, 0, v1 - v0, H, 0, 0), st,
                         out);
    }
  }
  cat->gen_begin[gtp] = b->ngen;
out:
  free(ls);
  return st;
}

refit_status_t refit_catalog_create(const refit_model_t *model,
                                    const refit_trainer_layout_t *trainer,
                                    const refit_generator_layout_t *generator,
                                    refit_catalog_t **out) {
  refit_catalog_builder_t b = {0};
  refit_status_t st;
  refit_catalog_t *cat;

  REFIT_CHECK(refit_layout_check(model, trainer, generator));
  if (trainer->pp > 64)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "trainer.pp = %d: the catalog holds at most 64 stages", trainer->pp);
  cat = calloc(1, sizeof(*cat));
  if (cat == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "catalog: allocation failed");
  cat->model = *model;
  cat->trainer = *trainer;
  cat->generator = *generator;
  cat->ranks_per_stage = trainer->tp * trainer->dp;
  b.cat = cat;
  REFIT_CHECK_GOTO(refit_stage_layers(model, trainer, cat->stage_first_layer),
                   st, err_free);
  cat->gen_begin = calloc((size_t)generator->tp + 1, sizeof(*cat->gen_begin));
  if (cat->gen_begin == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "catalog: allocation failed");
    goto err_free;
  }
  REFIT_CHECK_GOTO(refit_catalog_build(&b), st, err_free);
  REFIT_CHECK_GOTO(refit_catalog_index(cat), st, err_free);
  *out = cat;
  return REFIT_OK;

err_free:
  refit_catalog_destroy(cat);
  return st;
}

void refit_catalog_destroy(refit_catalog_t *cat) {
  if (cat == NULL)
    return;
  if (cat->hf != cat->src)
    free(cat->hf);
  free(cat->src);
  free(cat->runs);
  free(cat->hf_runs);
  free(cat->hf_run_begin);
  free(cat->gen);
  free(cat->gen_begin);
  free(cat->segs);
  free(cat->src_index);
  free(cat->hf_index);
  free(cat);
}

static uint64_t refit_name_hash(const char *name) {
  return refit_hash_bytes(REFIT_HASH_INIT, name, strlen(name));
}

static refit_status_t refit_name_index(const refit_src_tensor_t *t, int64_t n,
                                       int32_t **index, int64_t *mask) {
  int64_t size = 16;
  while (size < 2 * n)
    size *= 2;
  *index = calloc((size_t)size, sizeof(**index));
  if (*index == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "catalog: name index");
  *mask = size - 1;
  for (int64_t i = 0; i < n; i++) {
    int64_t slot = (int64_t)(refit_name_hash(t[i].name) & (uint64_t)*mask);
    while ((*index)[slot] != 0)
      slot = (slot + 1) & *mask;
    (*index)[slot] = (int32_t)i + 1;
  }
  return REFIT_OK;
}

static refit_status_t refit_catalog_index(refit_catalog_t *cat) {
  REFIT_CHECK(refit_name_index(cat->src, cat->nsrc, &cat->src_index,
                               &cat->src_index_mask));
  return refit_name_index(cat->hf, cat->nhf, &cat->hf_index, &cat->hf_index_mask);
}

int32_t refit_src_part_of(const refit_catalog_t *cat, const refit_src_tensor_t *t,
                          int32_t rank) {
  for (int32_t p = 0; p < t->nparts; p++)
    for (int32_t r = 0; r < t->nreplicas; r++)
      if (refit_src_holder(cat, t, p, r) == rank)
        return p;
  return -1;
}

int64_t refit_catalog_find_src(const refit_catalog_t *cat, const char *name,
                               int32_t rank) {
  int64_t slot = (int64_t)(refit_name_hash(name) & (uint64_t)cat->src_index_mask);
  while (cat->src_index[slot] != 0) {
    int64_t i = cat->src_index[slot] - 1;
    if (strcmp(cat->src[i].name, name) == 0 &&
        (rank < 0 || refit_src_part_of(cat, &cat->src[i], rank) >= 0))
      return i;
    slot = (slot + 1) & cat->src_index_mask;
  }
  return -1;
}

int64_t refit_catalog_find_hf(const refit_catalog_t *cat, const char *name) {
  int64_t slot = (int64_t)(refit_name_hash(name) & (uint64_t)cat->hf_index_mask);
  while (cat->hf_index[slot] != 0) {
    int64_t i = cat->hf_index[slot] - 1;
    if (strcmp(cat->hf[i].name, name) == 0)
      return i;
    slot = (slot + 1) & cat->hf_index_mask;
  }
  return -1;
}

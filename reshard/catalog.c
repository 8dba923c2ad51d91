/*
 * Catalog construction: Megatron-Core sharding of the HF-named parameters on
 * the trainer side, vLLM runtime tensors on the generator side. The rules are
 * those of ../shared/reference/sharding.md; each function below names the
 * rule it implements.
 */
#include "reshard/catalog.h"

#include "core/error.h"
#include "core/hash.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  refit_catalog_t *cat;
  int64_t src_cap, gen_cap, seg_cap;
  int64_t ngen;
} refit_catalog_builder_t;

static refit_status_t refit_catalog_index(refit_catalog_t *cat);

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

refit_status_t refit_stage_layers(const refit_model_t *model,
                                  const refit_trainer_layout_t *trainer,
                                  int64_t *first_layer) {
  const int64_t L = model->num_layers;
  const int pp = trainer->pp;
  const int64_t f = trainer->first_stage_layers;
  const int64_t l = trainer->last_stage_layers;

  if (pp < 1 || pp > 64)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "trainer.pp = %d: expected 1..64", pp);
  if (f < 0 || l < 0 || f > L || l > L)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "stage layers: first %lld / last %lld outside 0..num_layers "
                     "%lld",
                     (long long)f, (long long)l, (long long)L);
  first_layer[0] = 0;
  if (pp == 1) {
    if ((f != 0 && f != L) || (l != 0 && l != L))
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "with trainer.pp = 1 the stage holds all %lld layers",
                       (long long)L);
    first_layer[1] = L;
    return REFIT_OK;
  }
  if (f == 0 && l == 0) {
    if (L % pp != 0)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "num_layers %lld is not divisible by trainer.pp %d",
                       (long long)L, pp);
    for (int s = 1; s <= pp; s++)
      first_layer[s] = first_layer[s - 1] + L / pp;
    return REFIT_OK;
  }
  /* The stages not given split what the given ones leave, evenly (with
   * pp 2 and both given, that is nothing: they must add up). */
  const int64_t rest = L - f - l;
  const int stages = pp - (f != 0) - (l != 0);
  if ((stages == 0 && rest != 0) ||
      (stages > 0 && (rest < stages || rest % stages != 0)))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "stage layers: first %lld + last %lld leave %lld layers, "
                     "which %d middle stages cannot split evenly",
                     (long long)f, (long long)l, (long long)rest, stages);
  for (int s = 0; s < pp; s++) {
    const int64_t n = s == 0 && f ? f : (s == pp - 1 && l ? l : rest / stages);
    first_layer[s + 1] = first_layer[s] + n;
  }
  return REFIT_OK;
}

static refit_status_t refit_layout_check(const refit_model_t *m,
                                         const refit_trainer_layout_t *t,
                                         const refit_generator_layout_t *g) {
  const int moe = m->family == REFIT_FAMILY_QWEN3_MOE;
  const int64_t per_stage = (int64_t)t->tp * t->dp;

#define REFIT_RULE(cond, ...)                                                  \
  do {                                                                         \
    if (!(cond))                                                               \
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, __VA_ARGS__);               \
  } while (0)
  REFIT_RULE(t->tp >= 1 && t->pp >= 1 && t->dp >= 1 && t->ep >= 1 &&
                 t->etp >= 1 && g->tp >= 1 && g->ep >= 1 && g->engines >= 1,
             "every parallel size must be >= 1");
  REFIT_RULE(m->hidden_size > 0 && m->num_layers > 0 &&
                 m->num_attention_heads > 0 && m->num_kv_heads > 0 &&
                 m->head_dim > 0 && m->vocab_size > 0,
             "every model dimension must be > 0");
  REFIT_RULE(m->num_attention_heads % m->num_kv_heads == 0,
             "num_attention_heads %lld is not a multiple of num_kv_heads %lld",
             (long long)m->num_attention_heads, (long long)m->num_kv_heads);
  REFIT_RULE(m->num_attention_heads % t->tp == 0 && m->num_kv_heads % t->tp == 0,
             "trainer.tp %d must divide num_attention_heads %lld and "
             "num_kv_heads %lld",
             t->tp, (long long)m->num_attention_heads, (long long)m->num_kv_heads);
  REFIT_RULE(m->num_attention_heads % g->tp == 0 &&
                 (m->num_kv_heads % g->tp == 0 || g->tp % m->num_kv_heads == 0),
             "generator.tp %d must divide num_attention_heads %lld and divide "
             "or be a multiple of num_kv_heads %lld",
             g->tp, (long long)m->num_attention_heads, (long long)m->num_kv_heads);
  REFIT_RULE(m->vocab_size % t->tp == 0 && m->vocab_size % g->tp == 0,
             "vocab_size %lld must be divisible by trainer.tp %d and "
             "generator.tp %d",
             (long long)m->vocab_size, t->tp, g->tp);
  if (!moe) {
    REFIT_RULE(m->intermediate_size > 0 && m->intermediate_size % t->tp == 0 &&
                   m->intermediate_size % g->tp == 0,
               "intermediate_size %lld must be > 0 and divisible by trainer.tp "
               "%d and generator.tp %d",
               (long long)m->intermediate_size, t->tp, g->tp);
    REFIT_RULE(t->ep == 1 && t->etp == 1 && g->ep == 1,
               "expert parallelism needs family qwen3_moe");
  } else {
    REFIT_RULE(m->num_experts > 0 && m->moe_intermediate_size > 0,
               "qwen3_moe needs num_experts and moe_intermediate_size > 0");
    REFIT_RULE(per_stage % ((int64_t)t->ep * t->etp) == 0,
               "trainer.ep %d * trainer.etp %d must divide tp*dp = %lld",
               t->ep, t->etp, (long long)per_stage);
    REFIT_RULE(m->num_experts % t->ep == 0,
               "trainer.ep %d must divide num_experts %lld", t->ep,
               (long long)m->num_experts);
    REFIT_RULE(m->moe_intermediate_size % t->etp == 0,
               "trainer.etp %d must divide moe_intermediate_size %lld", t->etp,
               (long long)m->moe_intermediate_size);
    REFIT_RULE(g->ep == 1 || g->ep == g->tp,
               "generator.ep %d must be 1 or generator.tp %d", g->ep, g->tp);
    REFIT_RULE(g->ep == 1 ? m->moe_intermediate_size % g->tp == 0
                          : m->num_experts % g->tp == 0,
               "generator.tp %d must divide %s", g->tp,
               g->ep == 1 ? "moe_intermediate_size" : "num_experts");
  }
#undef REFIT_RULE
  return REFIT_OK;
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

static refit_status_t refit_add_seg(refit_catalog_builder_t *b,
                                    refit_gen_tensor_t *g, int32_t src,
                                    int64_t src_row, int64_t src_col,
                                    int64_t rows, int64_t cols, int64_t dst_row,
                                    int64_t dst_col) {
  refit_catalog_t *cat = b->cat;
  REFIT_CHECK(refit_catalog_grow((void **)&cat->segs, &b->seg_cap,
                                 cat->nsegs + 1, sizeof(*cat->segs)));
  refit_segment_t *s = &cat->segs[cat->nsegs++];
  s->src = src;
  s->src_row = src_row;
  s->src_col = src_col;
  s->rows = rows;
  s->cols = cols;
  s->dst_row = dst_row;
  s->dst_col = dst_col;
  g->seg_count++;
  return REFIT_OK;
}

/* Trainer tensor indices of one layer, filled by refit_build_src_layer. */
typedef struct {
  int32_t in_norm, post_norm, q, k, v, o, q_norm, k_norm;
  int32_t gate, up, down, router;
  int32_t expert0; /* first of 3 * X expert tensors: gate, up, down per e */
} refit_layer_src_t;

static refit_status_t refit_build_src_layer(refit_catalog_builder_t *b, int l,
                                            int stage, refit_layer_src_t *ls) {
  const refit_model_t *m = &b->cat->model;
  const int64_t H = m->hidden_size, D = m->head_dim;
  const int64_t QD = m->num_attention_heads * D, KVD = m->num_kv_heads * D;
  const char *p = "model.layers";

  REFIT_CHECK(refit_add_src(b, &ls->in_norm, stage, l, REFIT_ROLE_NORM,
                            REFIT_SPLIT_NONE, 1, H,
                            "%s.%d.input_layernorm.weight", p, l));
  REFIT_CHECK(refit_add_src(b, &ls->q, stage, l, REFIT_ROLE_LINEAR,
                            REFIT_SPLIT_ROWS, QD, H,
                            "%s.%d.self_attn.q_proj.weight", p, l));
  REFIT_CHECK(refit_add_src(b, &ls->k, stage, l, REFIT_ROLE_LINEAR,
                            REFIT_SPLIT_ROWS, KVD, H,
                            "%s.%d.self_attn.k_proj.weight", p, l));
  REFIT_CHECK(refit_add_src(b, &ls->v, stage, l, REFIT_ROLE_LINEAR,
                            REFIT_SPLIT_ROWS, KVD, H,
                            "%s.%d.self_attn.v_proj.weight", p, l));
  REFIT_CHECK(refit_add_src(b, &ls->o, stage, l, REFIT_ROLE_LINEAR,
                            REFIT_SPLIT_COLS, H, QD,
                            "%s.%d.self_attn.o_proj.weight", p, l));
  REFIT_CHECK(refit_add_src(b, &ls->q_norm, stage, l, REFIT_ROLE_NORM,
                            REFIT_SPLIT_NONE, 1, D,
                            "%s.%d.self_attn.q_norm.weight", p, l));
  REFIT_CHECK(refit_add_src(b, &ls->k_norm, stage, l, REFIT_ROLE_NORM,
                            REFIT_SPLIT_NONE, 1, D,
                            "%s.%d.self_attn.k_norm.weight", p, l));
  REFIT_CHECK(refit_add_src(b, &ls->post_norm, stage, l, REFIT_ROLE_NORM,
                            REFIT_SPLIT_NONE, 1, H,
                            "%s.%d.post_attention_layernorm.weight", p, l));
  if (m->family == REFIT_FAMILY_QWEN3) {
    const int64_t F = m->intermediate_size;
    REFIT_CHECK(refit_add_src(b, &ls->gate, stage, l, REFIT_ROLE_LINEAR,
                              REFIT_SPLIT_ROWS, F, H,
                              "%s.%d.mlp.gate_proj.weight", p, l));
    REFIT_CHECK(refit_add_src(b, &ls->up, stage, l, REFIT_ROLE_LINEAR,
                              REFIT_SPLIT_ROWS, F, H, "%s.%d.mlp.up_proj.weight",
                              p, l));
    REFIT_CHECK(refit_add_src(b, &ls->down, stage, l, REFIT_ROLE_LINEAR,
                              REFIT_SPLIT_COLS, H, F,
                              "%s.%d.mlp.down_proj.weight", p, l));
    return REFIT_OK;
  }
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
  REFIT_CHECK(refit_add_seg(b, g, ls->q, t * q_rows, 0, q_rows, H, 0, 0));
  REFIT_CHECK(refit_add_seg(b, g, ls->k, kv_row0, 0, kv_rows, H, q_rows, 0));
  REFIT_CHECK(refit_add_seg(b, g, ls->v, kv_row0, 0, kv_rows, H,
                            q_rows + kv_rows, 0));

  REFIT_GEN("self_attn.o_proj.weight", REFIT_ROLE_LINEAR, REFIT_GEN_LINEAR, 2, H,
            q_rows, 0);
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
    REFIT_CHECK(refit_add_seg(b, g, ls->gate, t * f, 0, f, H, 0, 0));
    REFIT_CHECK(refit_add_seg(b, g, ls->up, t * f, 0, f, H, f, 0));
    REFIT_GEN("mlp.down_proj.weight", REFIT_ROLE_LINEAR, REFIT_GEN_LINEAR, 2, H,
              f, 0);
    REFIT_CHECK(refit_add_seg(b, g, ls->down, 0, t * f, H, f, 0, 0));
    return REFIT_OK;
  }

  const int64_t X = m->num_experts, I = m->moe_intermediate_size;
  const int ep = b->cat->generator.ep;
  const int64_t E = ep == 1 ? X : X / gtp;   /* local experts */
  const int64_t i = ep == 1 ? I / gtp : I;    /* intermediate rows per rank */
  const int64_t e0 = ep == 1 ? 0 : t * E;     /* first global expert */
  const int64_t i0 = ep == 1 ? t * i : 0;     /* first intermediate row */

  REFIT_GEN("mlp.gate.weight", REFIT_ROLE_ROUTER, REFIT_GEN_LINEAR, 2, X, H, 0);
  REFIT_CHECK(refit_add_seg(b, g, ls->router, 0, 0, X, H, 0, 0));
  REFIT_GEN("mlp.experts.w13_weight", REFIT_ROLE_EXPERT, REFIT_GEN_MOE_W13, 3,
            E, 2 * i, H);
  for (int64_t e = 0; e < E; e++) {
    int32_t gate = ls->expert0 + (int32_t)(3 * (e0 + e));
    REFIT_CHECK(refit_add_seg(b, g, gate, i0, 0, i, H, e * 2 * i, 0));
    REFIT_CHECK(refit_add_seg(b, g, gate + 1, i0, 0, i, H, e * 2 * i + i, 0));
  }
  REFIT_GEN("mlp.experts.w2_weight", REFIT_ROLE_EXPERT, REFIT_GEN_MOE_W2, 3, E,
            H, i);
  for (int64_t e = 0; e < E; e++) {
    int32_t down = ls->expert0 + (int32_t)(3 * (e0 + e)) + 2;
    REFIT_CHECK(refit_add_seg(b, g, down, 0, i0, H, i, e * H, 0));
  }
#undef REFIT_GEN
  return REFIT_OK;
}

static refit_status_t refit_catalog_build(refit_catalog_builder_t *b) {
  refit_catalog_t *cat = b->cat;
  const refit_model_t *m = &cat->model;
  const int gtp = cat->generator.tp, pp = cat->trainer.pp;
  const int64_t H = m->hidden_size, V = m->vocab_size, L = m->num_layers;
  refit_layer_src_t *ls = calloc((size_t)L, sizeof(*ls));
  int32_t embed, norm, lm_head = -1;
  refit_gen_tensor_t *g;
  refit_status_t st = REFIT_OK;

  if (ls == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "catalog: %lld layers", (long long)L);
  /* Embedding on the first stage, final norm and lm_head on the last. */
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

  for (int t = 0; t < gtp; t++) {
    cat->gen_begin[t] = b->ngen;
    REFIT_CHECK_GOTO(refit_add_gen(b, &g, -1, REFIT_ROLE_EMBED, REFIT_GEN_PLAIN,
                                   2, V / gtp, H, 0,
                                   "model.embed_tokens.weight"),
                     st, out);
    REFIT_CHECK_GOTO(refit_add_seg(b, g, embed, t * (V / gtp), 0, V / gtp, H, 0, 0),
                     st, out);
    for (int64_t l = 0; l < L; l++)
      REFIT_CHECK_GOTO(refit_build_gen_layer(b, (int)l, t, &ls[l]), st, out);
    REFIT_CHECK_GOTO(refit_add_gen(b, &g, -1, REFIT_ROLE_NORM, REFIT_GEN_PLAIN,
                                   1, H, 0, 0, "model.norm.weight"),
                     st, out);
    REFIT_CHECK_GOTO(refit_add_seg(b, g, norm, 0, 0, 1, H, 0, 0), st, out);
    if (lm_head >= 0) {
      REFIT_CHECK_GOTO(refit_add_gen(b, &g, -1, REFIT_ROLE_LM_HEAD,
                                     REFIT_GEN_PLAIN, 2, V / gtp, H, 0,
                                     "lm_head.weight"),
                       st, out);
      REFIT_CHECK_GOTO(
          refit_add_seg(b, g, lm_head, t * (V / gtp), 0, V / gtp, H, 0, 0), st,
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
  free(cat->src);
  free(cat->gen);
  free(cat->gen_begin);
  free(cat->segs);
  free(cat->src_index);
  free(cat);
}

static uint64_t refit_name_hash(const char *name) {
  return refit_hash_bytes(REFIT_HASH_INIT, name, strlen(name));
}

static refit_status_t refit_catalog_index(refit_catalog_t *cat) {
  int64_t size = 16;
  while (size < 2 * cat->nsrc)
    size *= 2;
  cat->src_index = calloc((size_t)size, sizeof(*cat->src_index));
  if (cat->src_index == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "catalog: name index");
  cat->src_index_mask = size - 1;
  for (int64_t i = 0; i < cat->nsrc; i++) {
    int64_t slot = (int64_t)(refit_name_hash(cat->src[i].name) & (uint64_t)cat->src_index_mask);
    while (cat->src_index[slot] != 0)
      slot = (slot + 1) & cat->src_index_mask;
    cat->src_index[slot] = (int32_t)i + 1;
  }
  return REFIT_OK;
}

int64_t refit_catalog_find_src(const refit_catalog_t *cat, const char *name) {
  int64_t slot = (int64_t)(refit_name_hash(name) & (uint64_t)cat->src_index_mask);
  while (cat->src_index[slot] != 0) {
    int64_t i = cat->src_index[slot] - 1;
    if (strcmp(cat->src[i].name, name) == 0)
      return i;
    slot = (slot + 1) & cat->src_index_mask;
  }
  return -1;
}

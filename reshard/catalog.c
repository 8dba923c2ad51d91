/*
 * Catalog construction (catalog.h): the builder's tables (trainer tensors,
 * row runs, runtime tensors, segments), the walk that fills them, and the
 * lookups by name. What the tensors are is in three files, one per naming:
 * catalog_hf.c (the Hugging Face tensors, as the trainer holds them under
 * those names), catalog_megatron.c (Megatron-Core's tensors and names) and
 * catalog_runtime.c (vLLM's runtime tensors). The rules are those of
 * ../shared/reference/sharding.md; each function names the rule it
 * implements.
 */
#include "reshard/catalog_internal.h"

#include "core/error.h"
#include "core/hash.h"
#include "reshard/rules.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void refit_name_fmt(char *dst, const char *fmt, ...) {
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
refit_status_t refit_add_src(refit_catalog_builder_t *b, int32_t *index, int stage,
                             int32_t layer, refit_role_t role, refit_split_t split,
                             int64_t rows, int64_t cols, const char *fmt, ...) {
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
void refit_src_set_expert(const refit_catalog_t *cat, refit_src_tensor_t *t,
                          int64_t expert) {
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

refit_status_t refit_add_gen(refit_catalog_builder_t *b, refit_gen_tensor_t **out,
                             int32_t layer, refit_role_t role, refit_gen_kind_t kind,
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

refit_status_t refit_add_gen_bias(refit_catalog_builder_t *b, refit_gen_tensor_t **out,
                                  int32_t layer, int64_t n, const char *name) {
  REFIT_CHECK(
      refit_add_gen(b, out, layer, REFIT_ROLE_BIAS, REFIT_GEN_PLAIN, 1, n, 0, 0, name));
  (*out)->rows = n;
  (*out)->cols = 1;
  return REFIT_OK;
}

/* Rows [src_row, +rows) of trainer tensor `src` are rows [hf_row, +rows)
 * of Hugging Face tensor `hf`. */
refit_status_t refit_add_run(refit_catalog_builder_t *b, int32_t src, int32_t hf,
                             int64_t src_row, int64_t hf_row, int64_t rows) {
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
refit_status_t refit_add_seg(refit_catalog_builder_t *b, refit_gen_tensor_t *g,
                             int32_t hf, int64_t hf_row, int64_t col, int64_t rows,
                             int64_t cols, int64_t dst_row, int64_t dst_col) {
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

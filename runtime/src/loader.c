#include "loader.h"

#include "core/digest.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/layout.h"
#include "kernels/mxfp8.h"
#include "reshard/reference.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *refit_dtype_name(refit_dtype_t dtype) {
  switch (dtype) {
  case REFIT_DTYPE_BF16:
    return "bfloat16";
  case REFIT_DTYPE_E4M3:
    return "float8_e4m3fn";
  case REFIT_DTYPE_E8M0:
    return "e8m0";
  }
  return "?";
}

/* `entry` names a module: it matches a tensor name when it stands there as
 * whole dotted components ("mlp.gate" matches "...mlp.gate.weight", not
 * "...mlp.gate_up_proj.weight"). */
static int refit_loader_name_matches(const char *name, const char *entry) {
  const size_t n = strlen(entry);
  if (n == 0)
    return 0;
  for (const char *p = name; (p = strstr(p, entry)) != NULL; p++) {
    const int starts = p == name || p[-1] == '.';
    const int ends = p[n] == '\0' || p[n] == '.';
    if (starts && ends)
      return 1;
  }
  return 0;
}

int refit_loader_quantizes(const refit_config_t *cfg, const refit_gen_tensor_t *g) {
  if (cfg->refit.precision != REFIT_PRECISION_MXFP8 || g->kind == REFIT_GEN_PLAIN)
    return 0;
  for (int i = 0; i < cfg->refit.quantization_ignore_count; i++)
    if (refit_loader_name_matches(g->name, cfg->refit.quantization_ignore[i]))
      return 0;
  return 1;
}

void refit_loader_mark_quantized(refit_catalog_t *cat, const refit_config_t *cfg) {
  const int64_t n = cat->gen_begin[cat->generator.tp];
  for (int64_t i = 0; i < n; i++)
    cat->gen[i].quantized = refit_loader_quantizes(cfg, &cat->gen[i]);
}

static refit_kernels_dense_backend_t refit_loader_backend(const refit_loader_t *l) {
  return (refit_kernels_dense_backend_t)l->cfg->refit.linear_backend;
}

static refit_kernels_moe_shape_t refit_loader_moe_shape(const refit_gen_tensor_t *g) {
  refit_kernels_moe_shape_t m;
  m.num_experts = g->shape[0];
  m.gated = 1;
  if (g->kind == REFIT_GEN_MOE_W13) {
    m.intermediate = g->shape[1] / 2;
    m.hidden = g->shape[2];
  } else {
    m.hidden = g->shape[1];
    m.intermediate = g->shape[2];
  }
  return m;
}

static refit_store_t *refit_loader_add_store(refit_loader_t *l, int64_t gen,
                                             const char *suffix,
                                             refit_dtype_t dtype,
                                             const char *layout, int ndim,
                                             int64_t d0, int64_t d1, int64_t d2,
                                             size_t bytes) {
  refit_store_t *st = &l->stores[l->nstores++];
  snprintf(st->name, sizeof(st->name), "%s%s", l->cat->gen[gen].name, suffix);
  st->dtype = dtype;
  st->layout = layout;
  st->ndim = ndim;
  st->shape[0] = d0;
  st->shape[1] = d1;
  st->shape[2] = d2;
  st->gen = gen;
  st->is_scale = dtype == REFIT_DTYPE_E8M0;
  st->bytes = bytes;
  return st;
}

/* Describe the stores of tensor `gen`: one BF16 store, or weight + scale. */
static refit_status_t refit_loader_describe(refit_loader_t *l, int64_t gen) {
  const refit_gen_tensor_t *g = &l->cat->gen[gen];
  if (!g->quantized) {
    refit_loader_add_store(l, gen, "", REFIT_DTYPE_BF16, "linear", g->ndim,
                           g->shape[0], g->shape[1], g->shape[2],
                           (size_t)(g->rows * g->cols) * 2);
    return REFIT_OK;
  }
  if (g->kind == REFIT_GEN_LINEAR) {
    const refit_kernels_dense_backend_t b = refit_loader_backend(l);
    const int64_t n = g->rows, k = g->cols;
    int64_t wb, sb;
    REFIT_CHECK(refit_kernels_check_shape(b, g->name, n, k));
    REFIT_CHECK(refit_kernels_dense_sizes(b, n, k, &wb, &sb));
    if (b == REFIT_KERNELS_DENSE_FLASHINFER_TRTLLM)
      refit_loader_add_store(l, gen, "", REFIT_DTYPE_E4M3, "trtllm_dense", 2,
                             refit_round_up(n, 128), k, 0, (size_t)wb);
    else if (b == REFIT_KERNELS_DENSE_FLASHINFER_CUTEDSL)
      refit_loader_add_store(l, gen, "", REFIT_DTYPE_E4M3, "linear_kn", 2, k, n,
                             0, (size_t)wb);
    else
      refit_loader_add_store(l, gen, "", REFIT_DTYPE_E4M3, "linear", 2, n, k, 0,
                             (size_t)wb);
    refit_loader_add_store(l, gen, "_scale", REFIT_DTYPE_E8M0, "swizzle_128x4", 2,
                           refit_round_up(n, 128), refit_round_up(k / 32, 4), 0,
                           (size_t)sb);
    return REFIT_OK;
  }
  const refit_kernels_moe_shape_t m = refit_loader_moe_shape(g);
  refit_kernels_moe_sizes_t sz;
  REFIT_CHECK(refit_kernels_moe_check_shape(&m, g->name, &sz));
  const int w13 = g->kind == REFIT_GEN_MOE_W13;
  refit_loader_add_store(l, gen, "", REFIT_DTYPE_E4M3,
                         w13 ? "trtllm_moe_w13" : "trtllm_moe_w2", 3, g->shape[0],
                         g->shape[1], g->shape[2],
                         (size_t)(w13 ? sz.w13_weight : sz.w2_weight));
  const int64_t scale_bytes = w13 ? sz.w13_weight_scale : sz.w2_weight_scale;
  refit_loader_add_store(l, gen, "_scale", REFIT_DTYPE_E8M0, "swizzle_128x4", 2,
                         g->shape[0], scale_bytes / g->shape[0], 0,
                         (size_t)scale_bytes);
  return REFIT_OK;
}

refit_status_t refit_loader_create(const refit_catalog_t *cat,
                                   const refit_config_t *cfg, int tp_rank,
                                   int generator_rank, const refit_plan_t *plan,
                                   refit_loader_t **out) {
  refit_status_t st = REFIT_OK;
  refit_loader_t *l = calloc(1, sizeof(*l));
  if (l == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "loader");
  l->cat = cat;
  l->cfg = cfg;
  l->tp_rank = tp_rank;
  l->generator_rank = generator_rank;
  l->wire = plan->options.wire;
  l->trailer = plan->options.chunk_trailer;
  l->first = cat->gen_begin[tp_rank];
  l->ntensors = cat->gen_begin[tp_rank + 1] - l->first;
  l->stores = calloc((size_t)(2 * l->ntensors), sizeof(*l->stores));
  l->store_of = calloc((size_t)l->ntensors, sizeof(*l->store_of));
  l->assembly = calloc((size_t)l->ntensors, sizeof(*l->assembly));
  if (l->stores == NULL || l->store_of == NULL || l->assembly == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "loader tables");
    goto err;
  }
  for (int64_t i = 0; i < l->ntensors; i++) {
    l->store_of[i] = l->nstores;
    REFIT_CHECK_GOTO(refit_loader_describe(l, l->first + i), st, err);
  }
  *out = l;
  return REFIT_OK;

err:
  refit_loader_destroy(l);
  return st;
}

refit_status_t refit_loader_allocate(refit_loader_t *l) {
  const int keep = l->cfg->refit.mode == REFIT_MODE_ASYNC ||
                   l->cfg->refit.restore == REFIT_RESTORE_FULL;
  for (int64_t i = 0; i < l->nstores; i++) {
    refit_store_t *s = &l->stores[i];
    if (s->data == NULL) {
      /* Zeroed: storage is defined before the first refit. */
      s->data = calloc(s->bytes ? s->bytes : 1, 1);
      s->owned = 1;
    }
    if (keep && s->saved == NULL)
      s->saved = calloc(s->bytes ? s->bytes : 1, 1);
    if (s->data == NULL || (keep && s->saved == NULL))
      return REFIT_ERR(REFIT_ERR_NO_MEMORY,
                       "generator rank %d: runtime storage %s (%zu bytes%s)",
                       l->generator_rank, s->name, s->bytes,
                       keep ? ", twice: a saved copy is kept" : "");
    s->target = s->data;
  }
  return REFIT_OK;
}

static void refit_assembly_free(refit_assembly_t *a) {
  free(a->q);
  free(a->scale);
  a->q = NULL;
  a->scale = NULL;
}

void refit_loader_destroy(refit_loader_t *l) {
  if (l == NULL)
    return;
  if (l->stores != NULL)
    for (int64_t i = 0; i < l->nstores; i++) {
      if (l->stores[i].owned)
        free(l->stores[i].data);
      free(l->stores[i].saved);
    }
  if (l->assembly != NULL)
    for (int64_t i = 0; i < l->ntensors; i++)
      refit_assembly_free(&l->assembly[i]);
  free(l->stores);
  free(l->store_of);
  free(l->assembly);
  free(l);
}

void refit_loader_begin(refit_loader_t *l) {
  const int async = l->cfg->refit.mode == REFIT_MODE_ASYNC;
  for (int64_t i = 0; i < l->ntensors; i++) {
    refit_assembly_free(&l->assembly[i]);
    l->assembly[i].filled = 0;
  }
  for (int64_t i = 0; i < l->nstores; i++) {
    l->stores[i].target = async ? l->stores[i].saved : l->stores[i].data;
    l->stores[i].saved_valid = 0;
  }
  l->touched = 0;
}

/* Sync mode writes runtime storage in place: keep the previous bytes of a
 * store (restore: full) before its first byte is overwritten. */
static void refit_loader_touch(refit_loader_t *l, refit_store_t *s) {
  if (l->cfg->refit.mode == REFIT_MODE_ASYNC)
    return;
  l->touched = 1;
  if (s->saved != NULL && !s->saved_valid) {
    memcpy(s->saved, s->data, s->bytes);
    s->saved_valid = 1;
  }
}

int refit_loader_rollback(refit_loader_t *l) {
  for (int64_t i = 0; i < l->ntensors; i++)
    refit_assembly_free(&l->assembly[i]);
  if (l->cfg->refit.mode == REFIT_MODE_ASYNC)
    return 1; /* runtime storage was never written */
  if (!l->touched)
    return 1;
  if (l->cfg->refit.restore != REFIT_RESTORE_FULL)
    return 0;
  for (int64_t i = 0; i < l->nstores; i++) {
    refit_store_t *s = &l->stores[i];
    if (s->saved_valid)
      memcpy(s->data, s->saved, s->bytes);
    s->saved_valid = 0;
  }
  l->touched = 0;
  return 1;
}

void refit_loader_commit(refit_loader_t *l) {
  if (l->cfg->refit.mode == REFIT_MODE_ASYNC)
    for (int64_t i = 0; i < l->nstores; i++)
      memcpy(l->stores[i].data, l->stores[i].saved, l->stores[i].bytes);
  for (int64_t i = 0; i < l->nstores; i++) {
    l->stores[i].target = l->stores[i].data;
    l->stores[i].saved_valid = 0;
  }
  l->touched = 0;
}

/* Canonical q + linear scales -> the runtime layout of tensor i, written to
 * the targets of its weight and scale stores. */
static refit_status_t refit_loader_transform(const refit_loader_t *l, int64_t i,
                                             const uint8_t *q,
                                             const uint8_t *scale, void *w_out,
                                             void *s_out) {
  const refit_gen_tensor_t *g = &l->cat->gen[l->first + i];
  if (g->kind == REFIT_GEN_LINEAR)
    return refit_kernels_dense_transform(refit_loader_backend(l), g->rows,
                                         g->cols, q, scale, w_out, s_out);
  const refit_kernels_moe_shape_t m = refit_loader_moe_shape(g);
  return refit_kernels_moe_transform_tensor(
      &m, g->kind == REFIT_GEN_MOE_W13 ? REFIT_KERNELS_MOE_W13 : REFIT_KERNELS_MOE_W2,
      q, scale, w_out, s_out);
}

static refit_status_t refit_loader_land_quantized(refit_loader_t *l, int64_t i,
                                                  const refit_chunk_t *ch,
                                                  const unsigned char *src) {
  const refit_gen_tensor_t *g = &l->cat->gen[l->first + i];
  refit_assembly_t *a = &l->assembly[i];
  const int64_t kb = g->cols / 32;
  if (a->q == NULL) {
    a->q = malloc((size_t)(g->rows * g->cols));
    a->scale = malloc((size_t)(g->rows * kb));
    if (a->q == NULL || a->scale == NULL) {
      refit_assembly_free(a);
      return REFIT_ERR(REFIT_ERR_NO_MEMORY, "assembly of %s (%lld x %lld)",
                       g->name, (long long)g->rows, (long long)g->cols);
    }
  }
  uint8_t *q = a->q + ch->dst_row * g->cols + ch->dst_col;
  uint8_t *scale = a->scale + ch->dst_row * kb + ch->dst_col / 32;
  if (l->wire == REFIT_WIRE_BF16) {
    REFIT_CHECK(refit_mxfp8_quantize_rows((const uint16_t *)src, ch->rows, ch->cols,
                                          ch->cols, q, g->cols, scale, kb));
  } else {
    /* Prequantized on the trainer: per row K e4m3 bytes, then K/32 scales. */
    for (int64_t r = 0; r < ch->rows; r++) {
      const unsigned char *row = src + r * ch->row_bytes;
      memcpy(q + r * g->cols, row, (size_t)ch->cols);
      memcpy(scale + r * kb, row + ch->cols, (size_t)(ch->cols / 32));
    }
  }
  a->filled += ch->rows * ch->cols;
  if (a->filled < g->rows * g->cols)
    return REFIT_OK;
  /* Every piece present: the layout transform acts on the whole tensor. */
  refit_store_t *w = &l->stores[l->store_of[i]];
  refit_loader_touch(l, &w[0]);
  refit_loader_touch(l, &w[1]);
  refit_status_t st = refit_loader_transform(l, i, a->q, a->scale, w->target,
                                             w[1].target);
  refit_assembly_free(a);
  return st;
}

/* Land one chunk whose rows start at `src`. */
static refit_status_t refit_loader_land_chunk(refit_loader_t *l,
                                              const refit_chunk_t *ch,
                                              const unsigned char *src) {
  const int64_t i = ch->dst_tensor - l->first;
  const refit_gen_tensor_t *g = &l->cat->gen[ch->dst_tensor];
  if (l->assembly[i].filled + ch->rows * ch->cols > g->rows * g->cols)
    return REFIT_ERR(REFIT_ERR_INTEGRITY,
                     "generator rank %d: tensor %s received more elements than "
                     "it has (%lld landed, %lld more from trainer rank %d, "
                     "%lld in the tensor): a duplicate chunk",
                     l->generator_rank, g->name, (long long)l->assembly[i].filled,
                     (long long)(ch->rows * ch->cols), ch->src_rank,
                     (long long)(g->rows * g->cols));
  if (g->quantized)
    return refit_loader_land_quantized(l, i, ch, src);
  refit_store_t *store = &l->stores[l->store_of[i]];
  refit_loader_touch(l, store);
  uint16_t *dst = (uint16_t *)store->target + ch->dst_row * g->cols + ch->dst_col;
  for (int64_t r = 0; r < ch->rows; r++)
    memcpy(dst + r * g->cols, src + r * ch->row_bytes, (size_t)ch->row_bytes);
  l->assembly[i].filled += ch->rows * ch->cols;
  return REFIT_OK;
}

refit_status_t refit_loader_land(refit_loader_t *l, const refit_plan_t *plan,
                                 const refit_msg_t *m, unsigned char *staging,
                                 refit_land_fault_t fault) {
  for (int64_t c = m->chunk_begin; c < m->chunk_begin + m->chunk_count; c++) {
    const refit_chunk_t *ch = &plan->chunks[c];
    unsigned char *src = staging + ch->offset;
    const size_t bytes = (size_t)(ch->rows * ch->row_bytes);
    const int first = c == m->chunk_begin;
    if (first && fault == REFIT_LAND_DROP_ONE)
      continue;
    if (first && fault == REFIT_LAND_FLIP_ONE)
      src[bytes / 2] ^= 0x10;
    if (l->trailer > 0) {
      uint64_t sent;
      memcpy(&sent, src + bytes, sizeof(sent));
      const uint64_t got = refit_digest64(src, bytes);
      if (got != sent)
        return REFIT_ERR(REFIT_ERR_INTEGRITY,
                         "digest mismatch in tensor %s (rows %lld..%lld, cols "
                         "%lld..%lld) sent by trainer rank %d to generator rank "
                         "%d: sender 0x%016llx, receiver 0x%016llx",
                         l->cat->gen[ch->dst_tensor].name, (long long)ch->dst_row,
                         (long long)(ch->dst_row + ch->rows - 1),
                         (long long)ch->dst_col,
                         (long long)(ch->dst_col + ch->cols - 1), ch->src_rank,
                         l->generator_rank, (unsigned long long)sent,
                         (unsigned long long)got);
    }
    REFIT_CHECK(refit_loader_land_chunk(l, ch, src));
    if (first && fault == REFIT_LAND_DUPLICATE_ONE)
      REFIT_CHECK(refit_loader_land_chunk(l, ch, src));
  }
  return REFIT_OK;
}

refit_status_t refit_loader_end(refit_loader_t *l) {
  for (int64_t i = 0; i < l->ntensors; i++) {
    const refit_gen_tensor_t *g = &l->cat->gen[l->first + i];
    if (l->assembly[i].filled != g->rows * g->cols)
      return REFIT_ERR(REFIT_ERR_INTEGRITY,
                       "generator rank %d: tensor %s incomplete: %lld of %lld "
                       "elements landed (a chunk was lost)",
                       l->generator_rank, g->name,
                       (long long)l->assembly[i].filled,
                       (long long)(g->rows * g->cols));
  }
  return REFIT_OK;
}

/* The expected BF16 matrix of tensor i for `version`, from the source and
 * the reference rules (not from the catalog's segments). */
static refit_status_t refit_loader_expected(const refit_loader_t *l,
                                            refit_source_t *src, uint64_t version,
                                            int64_t i, uint16_t *out) {
  const refit_catalog_t *cat = l->cat;
  const refit_gen_tensor_t *g = &cat->gen[l->first + i];
  for (int64_t row = 0; row < g->rows; row++) {
    char name[REFIT_NAME_MAX];
    int64_t src_row, col_off;
    REFIT_CHECK(refit_reference_source_row(&cat->model, &cat->generator,
                                           l->tp_rank, g->name, row, name,
                                           &src_row, &col_off));
    const int64_t si = refit_catalog_find_src(cat, name);
    if (si < 0)
      return REFIT_ERR(REFIT_ERR_INTERNAL,
                       "verify: %s row %lld names unknown source %s", g->name,
                       (long long)row, name);
    REFIT_CHECK(src->ops->read(src->ctx, &cat->src[si], version, src_row,
                               col_off, 1, g->cols, out + row * g->cols));
  }
  return REFIT_OK;
}

/* Count differing bytes of `got` against `want`; log the first. */
static int64_t refit_loader_compare(const refit_store_t *s, const void *want,
                                    const void *got, size_t elem, uint64_t version,
                                    int generator_rank, int64_t already_bad) {
  const unsigned char *w = want, *g = got;
  int64_t bad = 0;
  const size_t n = s->bytes / elem;
  if (memcmp(want, got, s->bytes) == 0)
    return 0;
  for (size_t e = 0; e < n; e++) {
    if (memcmp(w + e * elem, g + e * elem, elem) == 0)
      continue;
    if (bad == 0 && already_bad == 0) {
      unsigned long long ew = 0, ag = 0;
      memcpy(&ew, w + e * elem, elem);
      memcpy(&ag, g + e * elem, elem);
      REFIT_WARN("verify: version %llu, generator rank %d, %s %s (layout %s): "
                 "first mismatch at element %zu of %zu: expected 0x%0*llx, "
                 "actual 0x%0*llx",
                 (unsigned long long)version, generator_rank, s->name,
                 refit_dtype_name(s->dtype), s->layout, e, n, (int)(2 * elem), ew,
                 (int)(2 * elem), ag);
    }
    bad++;
  }
  return bad;
}

refit_status_t refit_loader_verify(refit_loader_t *l, refit_source_t *src,
                                   uint64_t version, int64_t *mismatches) {
  const int generator_rank = l->generator_rank;
  refit_status_t st = REFIT_OK;
  int64_t bad = 0;
  for (int64_t i = 0; i < l->ntensors && st == REFIT_OK; i++) {
    const refit_gen_tensor_t *g = &l->cat->gen[l->first + i];
    const refit_store_t *w = &l->stores[l->store_of[i]];
    uint16_t *want = malloc((size_t)(g->rows * g->cols) * 2);
    uint8_t *q = NULL, *scale = NULL, *w_out = NULL, *s_out = NULL;
    if (want == NULL) {
      st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "verify: %s", g->name);
      break;
    }
    REFIT_CHECK_GOTO(refit_loader_expected(l, src, version, i, want), st, next);
    if (!g->quantized) {
      bad += refit_loader_compare(w, want, w->data, 2,
                                  version, generator_rank, bad);
      goto next;
    }
    q = malloc((size_t)(g->rows * g->cols));
    scale = malloc((size_t)(g->rows * g->cols / 32));
    w_out = calloc(w[0].bytes, 1);
    s_out = calloc(w[1].bytes, 1);
    if (q == NULL || scale == NULL || w_out == NULL || s_out == NULL) {
      st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "verify: %s", g->name);
      goto next;
    }
    /* The whole tensor at once, unlike the data path's chunk by chunk. */
    REFIT_CHECK_GOTO(refit_mxfp8_quantize_rows(want, g->rows, g->cols, g->cols, q,
                                               g->cols, scale, g->cols / 32),
                     st, next);
    REFIT_CHECK_GOTO(refit_loader_transform(l, i, q, scale, w_out, s_out), st,
                     next);
    bad += refit_loader_compare(&w[0], w_out, w[0].data,
                                1, version, generator_rank, bad);
    bad += refit_loader_compare(&w[1], s_out, w[1].data,
                                1, version, generator_rank, bad);
  next:
    free(want);
    free(q);
    free(scale);
    free(w_out);
    free(s_out);
  }
  *mismatches = bad;
  return st;
}

#include "generator/loader.h"

#include "core/digest.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/layout.h"
#include "kernels/mxfp8.h"
#include "kernels/nvfp4.h"
#include "reshard/plan.h"
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
  case REFIT_DTYPE_F32:
    return "float32";
  case REFIT_DTYPE_U8:
    return "uint8";
  }
  return "?";
}

static refit_kernels_dense_backend_t refit_loader_backend(const refit_loader_t *l) {
  return (refit_kernels_dense_backend_t)l->cfg->refit.linear_backend;
}

static refit_kernels_moe_backend_t refit_loader_moe_backend(const refit_loader_t *l) {
  return (refit_kernels_moe_backend_t)l->cfg->refit.moe_backend;
}

refit_kernels_moe_shape_t refit_loader_moe_shape(const refit_gen_tensor_t *g) {
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
  st->is_scale = dtype == REFIT_DTYPE_E8M0 || dtype == REFIT_DTYPE_F32 ||
                 strncmp(suffix, "_scale", 6) == 0;
  st->bytes = bytes;
  return st;
}

/* Does tensor g carry MLA's dequantized copy (a third store)? kv_b_proj
 * under block FP8: vLLM's MLAAttention keeps W_UK_T and W_UV as views of
 * scaled_dequantize(kv_b_proj), a BF16 buffer of kv_b_proj's shape that
 * is not the weight's storage (model-families.md 3.4); refit rewrites it
 * in place from the new e4m3 bytes and scales. */
static int refit_loader_has_dequant(const refit_gen_tensor_t *g) {
  return g->quantized == REFIT_QUANT_FP8_BLOCK && g->mla_derived;
}

/* NVFP4 experts (vLLM's ModelOptNvFp4FusedMoE after
 * process_weights_after_loading, docs/nvfp4.md "MoE"): the packed weight
 * [E, rows, K/2] in refit.moe_backend's row order, the E4M3 scales
 * [E, round_up(rows, 128), round_up(K/16, 4)] 128x4-swizzled per expert
 * after the same row order, and one FP32 decode scale per expert
 * ([E]: w13's is the max over the expert's gate and up). */
static refit_status_t refit_loader_describe_nvfp4_moe(refit_loader_t *l, int64_t gen) {
  const refit_gen_tensor_t *g = &l->cat->gen[gen];
  const refit_kernels_moe_backend_t backend = refit_loader_moe_backend(l);
  const refit_kernels_moe_shape_t m = refit_loader_moe_shape(g);
  REFIT_CHECK(refit_kernels_nvfp4_moe_check_shape(backend, &m, g->name));
  const int64_t e = g->shape[0], n = g->rows / e, k = g->cols;
  const int64_t kb = refit_nvfp4_scale_cols(k), rb = refit_nvfp4_row_bytes(k);
  const int w13 = g->kind == REFIT_GEN_MOE_W13;
  const char *layout = backend == REFIT_KERNELS_MOE_FLASHINFER_TRTLLM
                           ? (w13 ? "trtllm_moe_w13" : "trtllm_moe_w2")
                           : (w13 ? "cutlass_moe_w31" : "linear");
  refit_loader_add_store(l, gen, "", REFIT_DTYPE_U8, layout, 3, e, n, rb,
                         (size_t)(e * n * rb));
  refit_loader_add_store(l, gen, "_scale", REFIT_DTYPE_E4M3, "swizzle_128x4", 3, e,
                         refit_round_up(n, 128), refit_round_up(kb, 4),
                         (size_t)(e * refit_kernels_swizzle_bytes(n, kb)));
  refit_loader_add_store(l, gen, "_scale_2", REFIT_DTYPE_F32, "per_expert", 1, e, 0, 0,
                         (size_t)e * sizeof(float));
  return REFIT_OK;
}

/* Describe the stores of tensor `gen`: one BF16 store, or weight + scale
 * (+ MLA's dequantized copy). */
static refit_status_t refit_loader_describe(refit_loader_t *l, int64_t gen) {
  const refit_gen_tensor_t *g = &l->cat->gen[gen];
  if (!g->quantized) {
    /* An FP32 vector's shape counts float32 elements; its 2-byte units
     * (rows * cols) are its bytes all the same. */
    refit_loader_add_store(l, gen, "",
                           g->role == REFIT_ROLE_F32 ? REFIT_DTYPE_F32 : REFIT_DTYPE_BF16,
                           "linear", g->ndim, g->shape[0], g->shape[1], g->shape[2],
                           (size_t)(g->rows * g->cols) * 2);
    return REFIT_OK;
  }
  if (g->quantized == REFIT_QUANT_FP8_BLOCK) {
    /* vLLM's Fp8LinearMethod / Fp8MoEMethod with a weight_block_size: the
     * weight as it is, and one FP32 scale per 128 x 128 block of each
     * matrix (reshard/blocks.h). */
    const int64_t e = refit_block_matrices(g), sr = refit_block_scale_rows(g) / e,
                  sc = refit_block_scale_cols(g);
    refit_block_piece_t *p = NULL;
    REFIT_CHECK(refit_block_pieces(l->cat, gen, &p, &l->npieces[gen - l->first]));
    l->pieces[gen - l->first] = p;
    refit_loader_add_store(l, gen, "", REFIT_DTYPE_E4M3, "linear", g->ndim, g->shape[0],
                           g->shape[1], g->shape[2], (size_t)(g->rows * g->cols));
    refit_loader_add_store(l, gen, "_scale_inv", REFIT_DTYPE_F32, "block_128x128",
                           g->ndim, g->ndim == 3 ? e : sr, g->ndim == 3 ? sr : sc,
                           g->ndim == 3 ? sc : 0, (size_t)(e * sr * sc) * sizeof(float));
    if (refit_loader_has_dequant(g))
      refit_loader_add_store(l, gen, "_dequant", REFIT_DTYPE_BF16, "linear", 2, g->rows,
                             g->cols, 0, (size_t)(g->rows * g->cols) * 2);
    return REFIT_OK;
  }
  if (g->quantized == REFIT_QUANT_NVFP4) {
    /* vLLM's ModelOptNvFp4LinearMethod after loading, as FlashInfer's
     * CUTLASS FP4 GEMM reads it (docs/nvfp4.md): the packed weight as it
     * is, the E4M3 block scales 128x4-swizzled, and the one global decode
     * scale (weight_scale_2.max() over a fused layer's pieces). */
    const int64_t n = g->rows, k = g->cols, kb = refit_nvfp4_scale_cols(k);
    refit_block_piece_t *p = NULL;
    REFIT_CHECK(refit_block_pieces(l->cat, gen, &p, &l->npieces[gen - l->first]));
    l->pieces[gen - l->first] = p;
    if (g->kind != REFIT_GEN_LINEAR)
      return refit_loader_describe_nvfp4_moe(l, gen);
    refit_loader_add_store(l, gen, "", REFIT_DTYPE_U8, "linear", 2, n,
                           refit_nvfp4_row_bytes(k), 0,
                           (size_t)(n * refit_nvfp4_row_bytes(k)));
    refit_loader_add_store(l, gen, "_scale", REFIT_DTYPE_E4M3, "swizzle_128x4", 2,
                           refit_round_up(n, 128), refit_round_up(kb, 4), 0,
                           (size_t)refit_kernels_swizzle_bytes(n, kb));
    refit_loader_add_store(l, gen, "_scale_2", REFIT_DTYPE_F32, "scalar", 1, 1, 0, 0,
                           sizeof(float));
    return REFIT_OK;
  }
  if (g->kind == REFIT_GEN_LINEAR) {
    const refit_kernels_dense_backend_t b = refit_loader_backend(l);
    const int64_t n = g->rows, k = g->cols;
    int64_t wb, sb;
    REFIT_CHECK(refit_kernels_check_shape(b, g->name, n, k));
    REFIT_CHECK(refit_kernels_dense_sizes(b, n, k, &wb, &sb));
    int perm;
    if (b == REFIT_KERNELS_DENSE_FLASHINFER_TRTLLM)
      refit_loader_add_store(l, gen, "", REFIT_DTYPE_E4M3, "trtllm_dense", 2,
                             refit_kernels_dense_rows(b, n, &perm), k, 0, (size_t)wb);
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
                                   const refit_config_t *cfg, refit_mem_t *mem,
                                   int tp_rank, int generator_rank,
                                   const refit_plan_t *plan,
                                   refit_loader_t **out) {
  refit_status_t st = REFIT_OK;
  refit_loader_t *l = calloc(1, sizeof(*l));
  if (l == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "loader");
  l->cat = cat;
  l->cfg = cfg;
  l->mem = mem;
  l->plan = plan;
  l->tp_rank = tp_rank;
  l->generator_rank = generator_rank;
  l->wire = plan->options.wire;
  l->trailer = plan->options.chunk_trailer;
  l->first = cat->gen_begin[tp_rank];
  l->ntensors = cat->gen_begin[tp_rank + 1] - l->first;
  /* At most 3 stores a tensor: weight, scale, MLA's dequantized copy. */
  l->stores = calloc((size_t)(3 * l->ntensors), sizeof(*l->stores));
  l->store_of = calloc((size_t)l->ntensors, sizeof(*l->store_of));
  l->filled = calloc((size_t)l->ntensors, sizeof(*l->filled));
  l->arena_off = malloc((size_t)l->ntensors * sizeof(*l->arena_off));
  l->pieces = calloc((size_t)(l->ntensors ? l->ntensors : 1), sizeof(*l->pieces));
  l->npieces = calloc((size_t)(l->ntensors ? l->ntensors : 1), sizeof(*l->npieces));
  /* One global scale per stacked matrix (expert) of each tensor. */
  l->gsf_at = malloc((size_t)(l->ntensors ? l->ntensors : 1) * sizeof(*l->gsf_at));
  int64_t nscales = 0;
  for (int64_t i = 0; l->gsf_at != NULL && i < l->ntensors; i++) {
    l->gsf_at[i] = nscales;
    nscales += refit_block_matrices(&cat->gen[l->first + i]);
  }
  l->gsf = calloc((size_t)(nscales ? nscales : 1), sizeof(*l->gsf));
  if (l->stores == NULL || l->store_of == NULL || l->filled == NULL ||
      l->arena_off == NULL || l->pieces == NULL || l->npieces == NULL || l->gsf == NULL ||
      l->gsf_at == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "loader tables");
    goto err;
  }
  for (int64_t i = 0; i < l->ntensors; i++) {
    l->store_of[i] = l->nstores;
    l->arena_off[i] = -1;
    REFIT_CHECK_GOTO(refit_loader_describe(l, l->first + i), st, err);
  }
  *out = l;
  return REFIT_OK;

err:
  refit_loader_destroy(l);
  return st;
}

static int64_t refit_loader_assembly_bytes(const refit_gen_tensor_t *g) {
  return refit_plan_assembly_bytes(g);
}

/* The scale_inv row (of its [E * ceil(n/128), ceil(K/128)] view) of row `row`
 * of block FP8 tensor i, a row that starts a block row of its piece. */
static int64_t refit_loader_scale_row(const refit_loader_t *l, int64_t i, int64_t row) {
  const refit_gen_tensor_t *g = &l->cat->gen[l->first + i];
  const int64_t n = g->rows / refit_block_matrices(g);
  const int64_t matrix = row / n, r0 = row - matrix * n;
  for (int64_t k = 0; k < l->npieces[i]; k++) {
    const refit_block_piece_t *p = &l->pieces[i][k];
    if (p->matrix == matrix && p->row0 <= r0 && r0 < p->row0 + p->rows)
      return p->scale_row0 + (r0 - p->row0) / REFIT_BLOCK_EDGE;
  }
  return 0; /* the plan's pieces are the catalog's: not reached */
}

/* loader.h */
void refit_loader_block_place(const refit_loader_t *l, const refit_chunk_t *ch, void **dst,
                              int64_t *dst_pitch, void **scale, int64_t *scale_pitch) {
  const int64_t i = ch->dst_tensor - l->first;
  const refit_gen_tensor_t *g = &l->cat->gen[ch->dst_tensor];
  const refit_store_t *w = &l->stores[l->store_of[i]];
  const int64_t sc = refit_block_scale_cols(g);
  *dst = (uint8_t *)w[0].target + ch->dst_row * g->cols + ch->dst_col;
  *dst_pitch = g->cols;
  *scale = (uint8_t *)w[1].target +
           (refit_loader_scale_row(l, i, ch->dst_row) * sc + ch->dst_col / REFIT_BLOCK_EDGE) *
               (int64_t)sizeof(float);
  *scale_pitch = sc * (int64_t)sizeof(float);
}

/* Does tensor g land straight in its runtime layout (MXFP8)? */
static int refit_loader_lands_in_layout(const refit_gen_tensor_t *g) {
  return g->quantized && !refit_plan_assembles(g);
}

/* Within each bucket of `order` (land order), the chunks of tensors landed
 * by the land kernels first, then those landed in their layout (stable). */
static void refit_loader_split_order(const refit_loader_t *l, int64_t *order, int64_t n,
                                     int64_t *tmp) {
  const refit_chunk_t *chunks = l->plan->chunks;
  for (int64_t b0 = 0, b1; b0 < n; b0 = b1) {
    int64_t m = 0;
    for (b1 = b0; b1 < n && chunks[order[b1]].bucket == chunks[order[b0]].bucket; b1++)
      ;
    for (int pass = 0; pass < 2; pass++)
      for (int64_t o = b0; o < b1; o++)
        if (refit_loader_lands_in_layout(&l->cat->gen[chunks[order[o]].dst_tensor]) == pass)
          tmp[m++] = order[o];
    memcpy(order + b0, tmp, (size_t)m * sizeof(*order));
  }
}

/* Descriptor k of chunk ch of MXFP8 tensor g in both tables: the wire
 * chunk in `land` (what the delta path reads; never run by the land
 * kernels), and its landing straight into the runtime layout in `layout`. */
static void refit_loader_layout_desc(const refit_loader_t *l, const refit_chunk_t *ch,
                                     const refit_gen_tensor_t *g, refit_land_desc_t *d,
                                     refit_direct_desc_t *x) {
  const refit_store_t *w = &l->stores[l->store_of[ch->dst_tensor - l->first]];
  d->op = l->wire == REFIT_WIRE_MXFP8 ? REFIT_CHUNK_SPLIT : REFIT_CHUNK_QUANTIZE;
  d->dst = w[0].target;
  d->dst_pitch = g->cols;
  d->scale = w[1].target;
  d->scale_pitch = g->cols / 32;
  refit_loader_direct_layout(l, g, w, x);
  x->op = l->wire == REFIT_WIRE_MXFP8 ? REFIT_DIRECT_SPLIT : REFIT_DIRECT_QUANTIZE;
  x->staged = 1;
  x->src_offset = ch->offset;
  x->src_pitch = ch->row_bytes;
  x->rows = ch->rows;
  x->cols = ch->cols;
  x->row0 = ch->dst_row;
  x->col0 = ch->dst_col;
  x->digest = d->digest;
  x->seal_key = d->seal_key;
  x->digest_offset = ch->offset + ch->rows * ch->row_bytes;
}

/* One land descriptor per chunk this rank receives, bucket by bucket, the
 * layouts' padding, and the arena place of every tensor that assembles,
 * from a dry run of the plan. */
static refit_status_t refit_loader_build_tables(refit_loader_t *l) {
  const refit_plan_t *p = l->plan;
  const refit_gen_tensor_t *gens = l->cat->gen + l->first;
  int64_t n = 0, top = 0;
  refit_status_t st = REFIT_OK;
  int64_t *seen = NULL, *tmp = NULL;
  refit_land_desc_t *descs = NULL;
  refit_direct_desc_t *xs = NULL;

  int64_t *order = NULL;
  REFIT_CHECK(refit_plan_land_order(p, l->generator_rank, &order, &n));
  descs = calloc((size_t)(n ? n : 1), sizeof(*descs));
  xs = calloc((size_t)(n + l->ntensors + 1), sizeof(*xs));
  tmp = malloc((size_t)(n ? n : 1) * sizeof(*tmp));
  l->desc_tensor = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
  l->desc_chunk = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
  l->land_begin = calloc((size_t)p->nbuckets + 1, sizeof(int64_t));
  l->land_split = calloc((size_t)p->nbuckets + 1, sizeof(int64_t));
  l->desc_completes = calloc((size_t)(n ? n : 1), 1);
  seen = calloc((size_t)l->ntensors, sizeof(*seen));
  if (descs == NULL || xs == NULL || tmp == NULL || l->desc_tensor == NULL ||
      l->desc_chunk == NULL || l->land_begin == NULL || l->land_split == NULL ||
      l->desc_completes == NULL || seen == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "land tables of %lld chunks", (long long)n);
    goto out;
  }
  refit_loader_split_order(l, order, n, tmp);

  /* Pass 1: the arena, from the plan (reshard/plan.h). */
  REFIT_CHECK_GOTO(refit_plan_assembly(l->plan, l->cat, l->generator_rank,
                                       l->arena_off, &top),
                   st, out);
  l->arena_bytes = top;
  REFIT_CHECK_GOTO(refit_mem_alloc(l->mem, (size_t)top, (void **)&l->arena), st, out);

  /* Pass 2: the descriptors, now that every address is known. */
  int64_t k = 0;
  for (int64_t o = 0; o < n; o++) {
    const int64_t c = order[o];
    const refit_chunk_t *ch = &p->chunks[c];
    const int64_t i = ch->dst_tensor - l->first;
    const refit_gen_tensor_t *g = &gens[i];
    refit_land_desc_t *d = &descs[k];
    d->src_offset = ch->offset;
    d->rows = ch->rows;
    d->cols = ch->cols;
    d->row_bytes = ch->row_bytes;
    d->digest = l->trailer > 0;
    d->seal_key = refit_seal_key(l->run_id, ch->bucket, ch->src_tensor, ch->src_row,
                                 ch->src_col);
    if (refit_plan_block_prequantized(p, ch->dst_tensor)) {
      /* Block FP8 quantized by the trainer, whole blocks: the values and
       * the scales of its block rows straight into place. */
      d->op = REFIT_CHUNK_BLOCK_SPLIT;
      refit_loader_block_place(l, ch, &d->dst, &d->dst_pitch, &d->scale, &d->scale_pitch);
    } else if (refit_plan_assembles(g)) {
      /* BF16 rows into the tensor's assembly area. */
      d->op = REFIT_CHUNK_COPY;
      d->dst = l->arena + l->arena_off[i] + (ch->dst_row * g->cols + ch->dst_col) * 2;
      d->dst_pitch = g->cols * 2;
    } else if (g->quantized) {
      refit_loader_layout_desc(l, ch, g, d, &xs[k]);
    } else {
      d->op = REFIT_CHUNK_COPY;
      d->dst = (uint8_t *)l->stores[l->store_of[i]].target +
               (ch->dst_row * g->cols + ch->dst_col) * 2;
      d->dst_pitch = g->cols * 2;
    }
    l->desc_tensor[k] = i;
    l->desc_chunk[k] = c;
    seen[i] += ch->rows * ch->cols;
    l->desc_completes[k] = refit_plan_assembles(g) && seen[i] == g->elements;
    l->land_begin[ch->bucket + 1] = k + 1;
    k++;
  }
  /* Buckets this rank receives nothing in keep an empty range; a bucket's
   * layout chunks follow its land-kernel ones. */
  for (int32_t b = 1; b <= p->nbuckets; b++)
    if (l->land_begin[b] < l->land_begin[b - 1])
      l->land_begin[b] = l->land_begin[b - 1];
  for (int32_t b = 0; b < p->nbuckets; b++) {
    int64_t k = l->land_begin[b];
    while (k < l->land_begin[b + 1] && !refit_loader_lands_in_layout(&gens[l->desc_tensor[k]]))
      k++;
    l->land_split[b] = k;
  }
  /* The padding of every MXFP8 tensor whose layout has some. */
  int64_t npads = 0;
  for (int64_t i = 0; i < l->ntensors; i++) {
    refit_direct_desc_t *x = &xs[n + npads];
    if (!refit_loader_lands_in_layout(&gens[i]) ||
        !refit_loader_direct_layout(l, &gens[i], &l->stores[l->store_of[i]], x)) {
      memset(x, 0, sizeof(*x));
      continue;
    }
    x->op = REFIT_DIRECT_PAD;
    x->rows = gens[i].kind == REFIT_GEN_LINEAR ? 1 : gens[i].shape[0];
    npads++;
  }
  l->layout_pads = npads;
  REFIT_CHECK_GOTO(refit_land_descs_check(descs, n), st, out);
  REFIT_CHECK_GOTO(refit_direct_descs_check(xs, n + npads), st, out);
  int64_t max_runs = 0, most = npads;
  for (int32_t b = 0; b < p->nbuckets; b++) {
    /* The last run, the layout run, and a duplicate from the fault seam. */
    int64_t runs = 3;
    for (int64_t k = l->land_begin[b]; k < l->land_begin[b + 1]; k++)
      runs += l->desc_completes[k];
    if (runs > max_runs)
      max_runs = runs;
    if (l->land_begin[b + 1] - l->land_split[b] > most)
      most = l->land_begin[b + 1] - l->land_split[b];
  }
  REFIT_CHECK_GOTO(refit_mem_land_reserve(l->mem, max_runs), st, out);
  REFIT_CHECK_GOTO(refit_mem_alloc(l->mem, (size_t)(most + 1) * 8, &l->direct_acc), st, out);
  l->land.host = descs;
  l->land.count = n;
  descs = NULL;
  REFIT_CHECK_GOTO(refit_mem_table_upload(l->mem, &l->land, sizeof(refit_land_desc_t)),
                   st, out);
  l->layout.host = xs;
  l->layout.count = n + npads;
  xs = NULL;
  REFIT_CHECK_GOTO(refit_mem_table_upload(l->mem, &l->layout, sizeof(refit_direct_desc_t)),
                   st, out);
  REFIT_CHECK_GOTO(refit_loader_delta_tables(l), st, out);
out:
  free(order);
  free(descs);
  free(xs);
  free(tmp);
  free(seen);
  return st;
}

void refit_loader_release(refit_loader_t *l) {
  if (l->arena != NULL)
    refit_mem_free(l->mem, l->arena);
  if (l->direct_acc != NULL)
    refit_mem_free(l->mem, l->direct_acc);
  l->direct_acc = NULL;
  l->arena = NULL;
  l->arena_bytes = 0;
  refit_mem_table_free(l->mem, &l->land);
  refit_mem_table_free(l->mem, &l->layout);
  free(l->land_begin);
  free(l->land_split);
  l->land_split = NULL;
  l->layout_pads = 0;
  free(l->desc_tensor);
  free(l->desc_chunk);
  free(l->desc_completes);
  free(l->chunk_desc);
  l->chunk_desc = NULL;
  l->desc_completes = NULL;
  l->land_begin = NULL;
  l->desc_tensor = NULL;
  l->desc_chunk = NULL;
}

refit_status_t refit_loader_acquire(refit_loader_t *l) {
  if (l->arena != NULL || l->direct)
    return REFIT_OK;
  return refit_loader_build_tables(l);
}

refit_status_t refit_loader_allocate(refit_loader_t *l) {
  const int keep = l->cfg->refit.mode == REFIT_MODE_ASYNC ||
                   l->cfg->refit.restore == REFIT_RESTORE_FULL;
  const int async = l->cfg->refit.mode == REFIT_MODE_ASYNC;
  size_t data_bytes = 0, saved_bytes = 0;
  int all_ours = 1;
  /* Stores the caller did not register live in one allocation, their saved
   * copies in another with the same offsets: when the session owns every
   * store, the async commit is a single device-speed copy. */
  for (int64_t i = 0; i < l->nstores; i++) {
    const size_t b = (l->stores[i].bytes + 255) & ~(size_t)255;
    if (l->stores[i].data == NULL)
      data_bytes += b;
    else
      all_ours = 0;
    saved_bytes += b;
  }
  if (data_bytes > 0)
    REFIT_CHECK(refit_mem_alloc(l->mem, data_bytes, &l->data_slab));
  if (keep)
    REFIT_CHECK(refit_mem_alloc(l->mem, saved_bytes, &l->saved_slab));
  l->slab_bytes = all_ours ? data_bytes : 0;
  size_t data_off = 0, saved_off = 0;
  for (int64_t i = 0; i < l->nstores; i++) {
    refit_store_t *s = &l->stores[i];
    const size_t b = (s->bytes + 255) & ~(size_t)255;
    if (s->data == NULL) {
      s->data = (unsigned char *)l->data_slab + data_off;
      data_off += b;
    }
    if (keep) {
      s->saved = (unsigned char *)l->saved_slab + saved_off;
      saved_off += b;
    }
    /* Targets are fixed for the session: the land tables hold them. */
    s->target = async ? s->saved : s->data;
  }
  /* Zero-copy tables need the trainers' addresses: built at the first
   * begin (refit_loader_direct_tables). */
  return l->direct ? REFIT_OK : refit_loader_build_tables(l);
}

void refit_loader_destroy(refit_loader_t *l) {
  if (l == NULL)
    return;
  if (l->data_slab != NULL)
    refit_mem_free(l->mem, l->data_slab);
  if (l->saved_slab != NULL)
    refit_mem_free(l->mem, l->saved_slab);
  void *dev[] = {l->undo_dev_at, l->undo_dev_old, l->trail_dev};
  for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
    if (dev[i] != NULL)
      refit_mem_free(l->mem, dev[i]);
  refit_loader_release(l);
  free(l->stores);
  free(l->store_of);
  free(l->filled);
  free(l->arena_off);
  for (int64_t i = 0; l->pieces != NULL && i < l->ntensors; i++)
    free(l->pieces[i]);
  free(l->pieces);
  free(l->npieces);
  free(l->gsf);
  free(l->gsf_at);
  free(l->place);
  free(l->sum[0]);
  free(l->sum[1]);
  free(l->undo_at);
  free(l->undo_old);
  free(l->gpu_chunks);
  free(l->gpu_outs);
  free(l->gpu_hosts);
  free(l->gpu_completes);
  free(l->gpu_seen);
  free(l->trail_host);
  free(l->trail_pieces);
  free(l);
}

void refit_loader_begin(refit_loader_t *l) {
  memset(l->filled, 0, (size_t)l->ntensors * sizeof(*l->filled));
  for (int64_t i = 0; i < l->nstores; i++)
    l->stores[i].saved_valid = 0;
  l->touched = 0;
  l->changed_bytes = l->written_bytes = 0;
  l->nundo = 0;
  if (l->gpu_seen != NULL)
    memset(l->gpu_seen, 0, (size_t)(l->nsums ? l->nsums : 1));
}

/* Sync mode writes runtime storage in place: keep the previous bytes of a
 * store (restore: full) before its first byte is overwritten. */
refit_status_t refit_loader_touch(refit_loader_t *l, refit_store_t *s) {
  if (l->cfg->refit.mode == REFIT_MODE_ASYNC)
    return REFIT_OK;
  l->touched = 1;
  if (s->saved != NULL && !s->saved_valid) {
    REFIT_CHECK(refit_mem_copy(l->mem, s->saved, s->data, s->bytes));
    s->saved_valid = 1;
  }
  return REFIT_OK;
}

int refit_loader_rollback(refit_loader_t *l) {
  if (l->cfg->refit.mode == REFIT_MODE_ASYNC)
    return 1; /* runtime storage was never written */
  if (!l->touched)
    return 1;
  if (l->cfg->refit.restore != REFIT_RESTORE_FULL)
    return 0;
  for (int64_t i = 0; i < l->nstores; i++) {
    refit_store_t *s = &l->stores[i];
    if (s->saved_valid && refit_mem_copy(l->mem, s->data, s->saved, s->bytes) != REFIT_OK)
      return 0;
    s->saved_valid = 0;
  }
  if (refit_mem_on_device(l->mem)) { /* delta refits: the GPU log */
    if (refit_mem_place_undo(l->mem, l->undo_dev_at, l->undo_dev_old, l->nundo) != REFIT_OK)
      return 0;
  } else {
    for (int64_t i = l->nundo - 1; i >= 0; i--) /* host memory: delta refits */
      *l->undo_at[i] = l->undo_old[i];
  }
  l->nundo = 0;
  if (refit_mem_sync(l->mem) != REFIT_OK)
    return 0;
  l->touched = 0;
  return 1;
}

refit_status_t refit_loader_commit(refit_loader_t *l) {
  if (l->cfg->refit.mode == REFIT_MODE_ASYNC && l->slab_bytes > 0) {
    REFIT_CHECK(refit_mem_copy(l->mem, l->data_slab, l->saved_slab, l->slab_bytes));
  } else if (l->cfg->refit.mode == REFIT_MODE_ASYNC) {
    for (int64_t i = 0; i < l->nstores; i++)
      REFIT_CHECK(refit_mem_copy(l->mem, l->stores[i].data, l->stores[i].saved,
                                 l->stores[i].bytes));
  }
  for (int64_t i = 0; i < l->nstores; i++)
    l->stores[i].saved_valid = 0;
  l->touched = 0;
  l->nundo = 0;
  refit_loader_delta_commit(l);
  return refit_mem_sync(l->mem);
}

/* Block FP8: tensor i's BF16 matrix `bf16` -> its e4m3 weight and FP32
 * scale_inv, piece by piece (each piece is quantized as NeMo-RL quantizes
 * its Hugging Face tensor: its own blocks, its own padding value). */
static refit_status_t refit_loader_fp8_block(const refit_loader_t *l, int64_t i,
                                             const uint16_t *bf16, uint8_t *w_out,
                                             float *s_out) {
  const refit_gen_tensor_t *g = &l->cat->gen[l->first + i];
  const int64_t n = g->rows / refit_block_matrices(g), sc = refit_block_scale_cols(g);
  for (int64_t k = 0; k < l->npieces[i]; k++) {
    const refit_block_piece_t *p = &l->pieces[i][k];
    const int64_t row = p->matrix * n + p->row0;
    REFIT_CHECK(refit_mem_fp8_block_quantize(
        l->mem, bf16 + row * g->cols, p->rows, g->cols, g->cols,
        (int)l->cfg->refit.fp8_scale, w_out + row * g->cols, g->cols,
        s_out + p->scale_row0 * sc, sc));
  }
  return REFIT_OK;
}

/* MLA's dequantized copy of tensor i (refit_loader_has_dequant) from its
 * e4m3 weight and scale_inv, piece by piece as they were quantized. */
static refit_status_t refit_loader_fp8_dequant(const refit_loader_t *l, int64_t i,
                                               const uint8_t *w, const float *s,
                                               uint16_t *out) {
  const refit_gen_tensor_t *g = &l->cat->gen[l->first + i];
  const int64_t n = g->rows / refit_block_matrices(g), sc = refit_block_scale_cols(g);
  for (int64_t k = 0; k < l->npieces[i]; k++) {
    const refit_block_piece_t *p = &l->pieces[i][k];
    const int64_t row = p->matrix * n + p->row0;
    REFIT_CHECK(refit_mem_fp8_block_dequantize(l->mem, w + row * g->cols, p->rows, g->cols,
                                               g->cols, s + p->scale_row0 * sc, sc,
                                               out + row * g->cols, g->cols));
  }
  return REFIT_OK;
}

/* NVFP4: the global scale of each stacked matrix of tensor i into gsf[]
 * from the amax keys of its pieces' whole Hugging Face tensors (keys[h]):
 * a matrix takes the max over its pieces (q, k, v; gate and up of one
 * expert), so every piece dequantizes under the one decode scale vLLM
 * keeps. Pieces are in row order, so a matrix's pieces are consecutive. */
static void refit_loader_gsf_of(const refit_loader_t *l, int64_t i, const int32_t *keys,
                                float *gsf) {
  int32_t key = 0;
  for (int64_t k = 0; k < l->npieces[i]; k++) {
    const refit_block_piece_t *p = &l->pieces[i][k];
    key = keys[p->hf] > key ? keys[p->hf] : key;
    if (k + 1 == l->npieces[i] || l->pieces[i][k + 1].matrix != p->matrix) {
      gsf[p->matrix] = refit_nvfp4_global_scale((uint16_t)key);
      key = 0;
    }
  }
}

void refit_loader_nvfp4_scales(refit_loader_t *l, const uint16_t *hf_keys) {
  int32_t *keys = malloc((size_t)(l->cat->nhf ? l->cat->nhf : 1) * sizeof(*keys));
  for (int64_t h = 0; keys != NULL && h < l->cat->nhf; h++)
    keys[h] = hf_keys[h];
  for (int64_t i = 0; i < l->ntensors; i++) {
    if (l->cat->gen[l->first + i].quantized != REFIT_QUANT_NVFP4)
      continue;
    float *gsf = l->gsf + l->gsf_at[i];
    const int64_t e = refit_block_matrices(&l->cat->gen[l->first + i]);
    if (keys == NULL) /* no scale: the tensor's quantization refuses it */
      memset(gsf, 0, (size_t)e * sizeof(*gsf));
    else
      refit_loader_gsf_of(l, i, keys, gsf);
  }
  free(keys);
}

/* NVFP4: tensor i's BF16 matrix `bf16` -> its packed weight, swizzled
 * scales (through `lin`, the linear scales [rows, ceil(K/16)]) and global
 * decode scales, each stacked matrix under its global scale gsf[e], in one
 * quantizer launch that writes the decode scales too. Experts are quantized
 * into `packed` ([rows, ceil(K/2)], canonical order) first, then laid out
 * for refit.moe_backend. */
static refit_status_t refit_loader_nvfp4(const refit_loader_t *l, int64_t i, const float *gsf,
                                         const uint16_t *bf16, uint8_t *lin, uint8_t *packed,
                                         uint8_t *w_out, uint8_t *s_out, float *s2_out) {
  const refit_gen_tensor_t *g = &l->cat->gen[l->first + i];
  const int64_t e = refit_block_matrices(g), n = g->rows / e, k = g->cols;
  const int64_t kb = refit_nvfp4_scale_cols(k);
  for (int64_t m = 0; m < e; m++)
    if (!(gsf[m] > 0.0f))
      return REFIT_ERR(REFIT_ERR_INTERNAL,
                       "generator rank %d: %s (matrix %lld) has no NVFP4 global scale "
                       "this refit",
                       l->generator_rank, g->name, (long long)m);
  if (g->kind == REFIT_GEN_LINEAR) {
    REFIT_CHECK(refit_mem_nvfp4_quantize(l->mem, bf16, 1, n, k, gsf, w_out, lin, s2_out));
    return refit_mem_scale_swizzle(l->mem, lin, 1, n, kb, s_out);
  }
  REFIT_CHECK(refit_mem_nvfp4_quantize(l->mem, bf16, e, n, k, gsf, packed, lin, s2_out));
  const refit_kernels_moe_shape_t shape = refit_loader_moe_shape(g);
  return refit_mem_nvfp4_moe_transform(
      l->mem, refit_loader_moe_backend(l), &shape,
      g->kind == REFIT_GEN_MOE_W13 ? REFIT_KERNELS_MOE_W13 : REFIT_KERNELS_MOE_W2, packed,
      lin, w_out, s_out);
}

/* Canonical q + linear scales -> the runtime layout of tensor i (for block
 * FP8, q is the BF16 matrix and scale unused). */
static refit_status_t refit_loader_transform(const refit_loader_t *l, int64_t i,
                                             const uint8_t *q,
                                             const uint8_t *scale, void *w_out,
                                             void *s_out) {
  const refit_gen_tensor_t *g = &l->cat->gen[l->first + i];
  if (g->quantized == REFIT_QUANT_FP8_BLOCK)
    return refit_loader_fp8_block(l, i, (const uint16_t *)(const void *)q, w_out, s_out);
  if (g->kind == REFIT_GEN_LINEAR)
    return refit_mem_dense_transform(l->mem, refit_loader_backend(l), g->rows,
                                     g->cols, q, scale, w_out, s_out);
  const refit_kernels_moe_shape_t m = refit_loader_moe_shape(g);
  const refit_kernels_moe_tensor_t which =
      g->kind == REFIT_GEN_MOE_W13 ? REFIT_KERNELS_MOE_W13 : REFIT_KERNELS_MOE_W2;
  if (!l->cfg->refit.baseline)
    return refit_mem_moe_transform(l->mem, &m, which, q, scale, w_out, s_out);
  /* Baseline: expert by expert, one transform each, as a straightforward
   * implementation does. Same bytes. */
  refit_kernels_moe_shape_t one = m;
  refit_kernels_moe_sizes_t sz;
  one.num_experts = 1;
  REFIT_CHECK(refit_kernels_moe_check_shape(&one, g->name, &sz));
  const int64_t rows = g->rows / m.num_experts;
  const int64_t w_bytes = which == REFIT_KERNELS_MOE_W13 ? sz.w13_weight : sz.w2_weight;
  const int64_t s_bytes =
      which == REFIT_KERNELS_MOE_W13 ? sz.w13_weight_scale : sz.w2_weight_scale;
  for (int64_t e = 0; e < m.num_experts; e++)
    REFIT_CHECK(refit_mem_moe_transform(
        l->mem, &one, which, q + e * rows * g->cols, scale + e * rows * (g->cols / 32),
        (uint8_t *)w_out + e * w_bytes, (uint8_t *)s_out + e * s_bytes));
  return REFIT_OK;
}

/* Count what descriptor k landed (more than the tensor holds: a duplicate). */
refit_status_t refit_loader_count(refit_loader_t *l, int64_t k) {
  const int64_t i = l->desc_tensor[k];
  const refit_chunk_t *ch = &l->plan->chunks[l->desc_chunk[k]];
  const refit_gen_tensor_t *g = &l->cat->gen[l->first + i];
  const int64_t total = g->elements;
  if (l->filled[i] + ch->rows * ch->cols > total)
    return REFIT_ERR(REFIT_ERR_INTEGRITY,
                     "generator rank %d: tensor %s received more elements than "
                     "it has (%lld landed, %lld more from trainer rank %d, "
                     "%lld in the tensor): a duplicate chunk",
                     l->generator_rank, g->name, (long long)l->filled[i],
                     (long long)(ch->rows * ch->cols), ch->src_rank,
                     (long long)total);
  l->filled[i] += ch->rows * ch->cols;
  return REFIT_OK;
}

/* Count what descriptor k landed; a tensor that is complete gets its layout
 * transform (quantized) now. */
refit_status_t refit_loader_account(refit_loader_t *l, int64_t k) {
  REFIT_CHECK(refit_loader_count(l, k));
  return refit_loader_complete(l, l->desc_tensor[k]);
}

refit_status_t refit_loader_complete(refit_loader_t *l, int64_t i) {
  const refit_gen_tensor_t *g = &l->cat->gen[l->first + i];
  /* Zero copy lands MXFP8 in its layout chunk by chunk: nothing is left. */
  if (!g->quantized || l->filled[i] < g->elements || (l->direct && !refit_plan_assembles(g)))
    return REFIT_OK;
  refit_store_t *w = &l->stores[l->store_of[i]];
  if (refit_plan_block_prequantized(l->plan, l->first + i)) {
    /* Landed in place (saved before): only MLA's dequantized copy is left. */
    if (!refit_loader_has_dequant(g))
      return REFIT_OK;
    REFIT_CHECK(refit_loader_touch(l, &w[2]));
    return refit_loader_fp8_dequant(l, i, w[0].target, w[1].target, w[2].target);
  }
  if (l->arena_off[i] < 0)
    return REFIT_OK; /* nothing assembles: landed in its layout */
  REFIT_CHECK(refit_loader_touch(l, &w[0]));
  REFIT_CHECK(refit_loader_touch(l, &w[1]));
  const uint8_t *q = l->arena + l->arena_off[i];
  if (g->quantized == REFIT_QUANT_NVFP4) {
    REFIT_CHECK(refit_loader_touch(l, &w[2]));
    uint8_t *lin = l->arena + l->arena_off[i] + g->rows * g->cols * 2;
    return refit_loader_nvfp4(l, i, l->gsf + l->gsf_at[i], (const uint16_t *)(const void *)q,
                              lin, lin + g->rows * refit_nvfp4_scale_cols(g->cols),
                              w[0].target, w[1].target, w[2].target);
  }
  REFIT_CHECK(refit_loader_transform(l, i, q, q + g->rows * g->cols, w[0].target,
                                     w[1].target));
  if (!refit_loader_has_dequant(g))
    return REFIT_OK;
  REFIT_CHECK(refit_loader_touch(l, &w[2]));
  return refit_loader_fp8_dequant(l, i, w[0].target, w[1].target, w[2].target);
}

void refit_loader_chunk_str(const refit_loader_t *l, int64_t k, char *buf, size_t len) {
  const refit_chunk_t *ch = &l->plan->chunks[l->desc_chunk[k]];
  snprintf(buf, len,
           "tensor %s (rows %lld..%lld, cols %lld..%lld) from trainer rank %d to "
           "generator rank %d",
           l->cat->gen[ch->dst_tensor].name, (long long)ch->dst_row,
           (long long)(ch->dst_row + ch->rows - 1), (long long)ch->dst_col,
           (long long)(ch->dst_col + ch->cols - 1), ch->src_rank, l->generator_rank);
}

/* The refit chunk k's trailer was sealed for, read back from staging; 0
 * when it is none (its rows were damaged: the tag decodes to no refit that
 * can precede this one). */
static uint64_t refit_loader_sealed_tag(refit_loader_t *l, int64_t k,
                                        const unsigned char *staging, uint64_t tag) {
  const refit_land_desc_t *d = &((const refit_land_desc_t *)l->land.host)[k];
  const size_t len = (size_t)(d->rows * d->row_bytes);
  unsigned char *rows = malloc(len + 8);
  if (rows == NULL ||
      refit_mem_to_host(l->mem, rows, staging + d->src_offset, len + 8) != REFIT_OK) {
    free(rows);
    return 0;
  }
  const uint64_t sent = refit_seal_untag(refit_trailer_load(rows + len),
                                         refit_digest64(rows, len), d->seal_key);
  free(rows);
  /* An earlier refit: an older version, or the same one at an earlier attempt. */
  const uint64_t v = refit_seal_version(sent), now = refit_seal_version(tag);
  const int older =
      v < now || (v == now && refit_seal_attempt(sent) < refit_seal_attempt(tag));
  return sent != tag && older && v > 0 ? sent : 0;
}

refit_status_t refit_loader_land_bucket(refit_loader_t *l, int32_t b,
                                        unsigned char *staging, uint64_t tag,
                                        refit_land_fault_t fault) {
  fault = refit_land_fault(fault);
  int64_t first = l->land_begin[b], end = l->land_begin[b + 1], runs = 0, bad = -1;
  const int64_t npad = b == 0 ? l->layout_pads : 0, pad0 = l->layout.count - l->layout_pads;
  if (first == end && npad == 0)
    return REFIT_OK;
  const refit_land_desc_t *descs = l->land.host;
  if (fault == REFIT_LAND_FLIP_ONE && first < end) {
    unsigned char byte;
    unsigned char *at = staging + descs[first].src_offset +
                        descs[first].rows * descs[first].row_bytes / 2;
    REFIT_CHECK(refit_mem_to_host(l->mem, &byte, at, 1));
    byte ^= 0x10;
    REFIT_CHECK(refit_mem_from_host(l->mem, at, &byte, 1));
  }
  if (fault == REFIT_LAND_DROP_ONE && first < end)
    first++;
  const int64_t split = l->land_split[b] > first ? l->land_split[b] : first;
  /* Stores written in place for the first time this refit are saved first:
   * BF16 and MXFP8 ones are written chunk by chunk, so at their first. */
  for (int64_t k = first; k < end; k++) {
    const int64_t i = l->desc_tensor[k];
    const refit_gen_tensor_t *g = &l->cat->gen[l->first + i];
    if (!refit_plan_assembles(g))
      REFIT_CHECK(refit_loader_touch(l, &l->stores[l->store_of[i]]));
    if (refit_loader_lands_in_layout(g))
      REFIT_CHECK(refit_loader_touch(l, &l->stores[l->store_of[i] + 1]));
    if (refit_plan_block_prequantized(l->plan, l->first + i)) {
      REFIT_CHECK(refit_loader_touch(l, &l->stores[l->store_of[i]]));
      REFIT_CHECK(refit_loader_touch(l, &l->stores[l->store_of[i] + 1]));
    }
  }
  for (int64_t i = 0; i < l->ntensors && npad > 0; i++)
    if (refit_loader_lands_in_layout(&l->cat->gen[l->first + i])) {
      REFIT_CHECK(refit_loader_touch(l, &l->stores[l->store_of[i]]));
      REFIT_CHECK(refit_loader_touch(l, &l->stores[l->store_of[i] + 1]));
    }
  /* The land kernels' chunks in runs that end where a tensor in the arena
   * completes, so its quantization and layout are queued (and its arena area
   * free for reuse, in stream order) before the next run lands: the arena
   * then holds only the tensors still incomplete, as refit_plan_assembly
   * planned. Then the MXFP8 chunks, each straight into its runtime layout,
   * in one run. Digests are collected once per bucket; on a mismatch the
   * whole refit is discarded. */
  int64_t start = first;
  for (int64_t k = first; k < split; k++) {
    if (!l->desc_completes[k] && k + 1 < split)
      continue;
    REFIT_CHECK(refit_mem_land_run(l->mem, &l->land, start, k + 1 - start, tag, staging,
                                   runs++));
    if (fault == REFIT_LAND_DUPLICATE_ONE && start == first) {
      REFIT_CHECK(refit_mem_land_run(l->mem, &l->land, first, 1, tag, staging, runs++));
      REFIT_CHECK(refit_loader_account(l, first));
    }
    for (int64_t j = start; j <= k; j++)
      REFIT_CHECK(refit_loader_account(l, j));
    start = k + 1;
  }
  if (split < end)
    REFIT_CHECK(refit_mem_direct_run(l->mem, &l->layout, split, end - split, tag, staging,
                                     l->direct_acc, runs++));
  if (fault == REFIT_LAND_DUPLICATE_ONE && split == first && first < end) {
    REFIT_CHECK(refit_mem_direct_run(l->mem, &l->layout, first, 1, tag, staging,
                                     l->direct_acc, runs++));
    REFIT_CHECK(refit_loader_account(l, first));
  }
  if (npad > 0)
    REFIT_CHECK(refit_mem_direct_run(l->mem, &l->layout, pad0, npad, tag, staging,
                                     l->direct_acc, -1));
  for (int64_t k = split; k < end; k++)
    REFIT_CHECK(refit_loader_account(l, k));
  REFIT_CHECK(refit_mem_land_collect(l->mem, runs, &bad));
  if (bad >= 0) {
    char what[REFIT_NAME_MAX + 160];
    refit_loader_chunk_str(l, bad, what, sizeof(what));
    const uint64_t sent = refit_loader_sealed_tag(l, bad, staging, tag);
    if (sent != 0)
      return REFIT_ERR(REFIT_ERR_INTEGRITY,
                       "stale chunk in %s: it was sent by the refit of version %llu "
                       "(attempt %llu), this is the refit of version %llu (attempt %llu); "
                       "a message of an earlier refit arrived, the refit is discarded",
                       what, (unsigned long long)refit_seal_version(sent),
                       (unsigned long long)refit_seal_attempt(sent),
                       (unsigned long long)refit_seal_version(tag),
                       (unsigned long long)refit_seal_attempt(tag));
    return REFIT_ERR(REFIT_ERR_INTEGRITY, "digest mismatch in %s", what);
  }
  REFIT_CHECK(refit_loader_delta_note(l, b, staging, tag));
  return refit_mem_sync(l->mem);
}

refit_status_t refit_loader_end(refit_loader_t *l) {
  for (int64_t i = 0; i < l->ntensors; i++) {
    const refit_gen_tensor_t *g = &l->cat->gen[l->first + i];
    if (l->filled[i] != g->elements)
      return REFIT_ERR(REFIT_ERR_INTEGRITY,
                       "generator rank %d: tensor %s incomplete: %lld of %lld "
                       "elements landed (a chunk was lost)",
                       l->generator_rank, g->name, (long long)l->filled[i],
                       (long long)g->elements);
  }
  return REFIT_OK;
}

/* The expected BF16 matrix of tensor i for `version` into `out` (this rank's
 * memory), from the source and the reference rules (not the catalog's
 * segments): on the device for synthetic sources, else read on the host. */
static refit_status_t refit_loader_expected(const refit_loader_t *l,
                                            refit_source_t *src, uint64_t version,
                                            int64_t i, uint16_t *out) {
  const refit_catalog_t *cat = l->cat;
  const refit_gen_tensor_t *g = &cat->gen[l->first + i];
  const int synth = src->ops->synth_key != NULL;
  refit_synth_key_t *keys = NULL;
  int64_t *bases = NULL;
  uint16_t *host = NULL;
  refit_status_t st = REFIT_OK;

  if (synth) {
    keys = malloc((size_t)g->rows * sizeof(*keys));
    bases = malloc((size_t)g->rows * sizeof(*bases));
  } else {
    host = malloc((size_t)(g->rows * g->cols) * sizeof(*host));
  }
  if ((synth && (keys == NULL || bases == NULL)) || (!synth && host == NULL)) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "verify: expected %s", g->name);
    goto out;
  }
  char prev[REFIT_NAME_MAX] = "";
  int64_t si = -1;
  refit_synth_key_t key = {0};
  /* Vocabulary padding rows (zeros, never sent) end a tensor. */
  int64_t valid = g->rows;
  for (int64_t row = 0; row < g->rows; row++) {
    char name[REFIT_NAME_MAX];
    int64_t src_row, col_off;
    REFIT_CHECK_GOTO(refit_reference_source_row(&cat->model, &cat->generator,
                                                l->tp_rank, g->name, row, name,
                                                &src_row, &col_off),
                     st, out);
    if (src_row < 0) {
      valid = row;
      break;
    }
    /* Consecutive rows mostly share a source tensor: look it up once. */
    if (si < 0 || strcmp(name, prev) != 0) {
      si = refit_catalog_find_hf(cat, name);
      if (si < 0) {
        st = REFIT_ERR(REFIT_ERR_INTERNAL,
                       "verify: %s row %lld names unknown source %s", g->name,
                       (long long)row, name);
        goto out;
      }
      memcpy(prev, name, sizeof(prev));
      if (synth)
        REFIT_CHECK_GOTO(src->ops->synth_key(src->ctx, &cat->hf[si], version, &key), st,
                         out);
    }
    const refit_src_tensor_t *t = &cat->hf[si];
    if (synth) {
      keys[row] = key;
      bases[row] = src_row * t->cols + col_off;
    } else {
      REFIT_CHECK_GOTO(src->ops->read(src->ctx, t, version, src_row, col_off, 1,
                                      g->cols, host + row * g->cols),
                       st, out);
    }
  }
  if (synth) {
    st = refit_mem_synth_rows(l->mem, keys, bases, valid, g->cols, out);
    if (st == REFIT_OK && valid < g->rows)
      st = refit_mem_zero(l->mem, out + valid * g->cols,
                          (size_t)((g->rows - valid) * g->cols) * sizeof(*out));
  } else {
    memset(host + valid * g->cols, 0,
           (size_t)((g->rows - valid) * g->cols) * sizeof(*host));
    st = refit_mem_from_host(l->mem, out, host,
                             (size_t)(g->rows * g->cols) * sizeof(*host));
  }
out:
  free(keys);
  free(bases);
  free(host);
  return st;
}

/* Count differing elements of a store against `want`; log the first. */
static refit_status_t refit_loader_compare(const refit_loader_t *l,
                                           const refit_store_t *s,
                                           const void *want, size_t elem,
                                           uint64_t version, int64_t *bad) {
  int64_t count = 0, first = 0;
  REFIT_CHECK(refit_mem_compare(l->mem, want, s->data, s->bytes, elem, &count, &first));
  if (count > 0 && *bad == 0) {
    unsigned long long ew = 0, ag = 0;
    REFIT_CHECK(refit_mem_to_host(l->mem, &ew, (const unsigned char *)want + first * elem, elem));
    REFIT_CHECK(refit_mem_to_host(l->mem, &ag, (const unsigned char *)s->data + first * elem, elem));
    REFIT_WARN("verify: version %llu, generator rank %d, %s %s (layout %s): "
               "first mismatch at element %lld of %zu: expected 0x%0*llx, "
               "actual 0x%0*llx (%lld elements differ)",
               (unsigned long long)version, l->generator_rank, s->name,
               refit_dtype_name(s->dtype), s->layout, (long long)first,
               s->bytes / elem, (int)(2 * elem), ew, (int)(2 * elem), ag,
               (long long)count);
  }
  *bad += count;
  return REFIT_OK;
}

/* NVFP4, for verify: the global scales of tensor i (one per stacked
 * matrix) from the source's whole Hugging Face tensors of its pieces (read
 * on the host, independent of the begin collective); keys[h] caches them
 * (-1: not read yet). */
static refit_status_t refit_loader_verify_gsf(const refit_loader_t *l, refit_source_t *src,
                                              uint64_t version, int64_t i, int32_t *keys,
                                              float *gsf) {
  const refit_catalog_t *cat = l->cat;
  refit_status_t st = REFIT_OK;
  for (int64_t k = 0; k < l->npieces[i] && st == REFIT_OK; k++) {
    const int32_t h = l->pieces[i][k].hf;
    if (keys[h] >= 0)
      continue;
    const refit_src_tensor_t *t = &cat->hf[h];
    uint16_t *host = malloc((size_t)(t->rows * t->cols) * sizeof(uint16_t) + 2);
    if (host == NULL)
      return REFIT_ERR(REFIT_ERR_NO_MEMORY, "verify: %s on the host", t->name);
    st = src->ops->read(src->ctx, t, version, 0, 0, t->rows, t->cols, host);
    if (st == REFIT_OK)
      keys[h] = refit_nvfp4_amax_key(host, t->rows, t->cols, t->cols, &st);
    free(host);
  }
  if (st == REFIT_OK)
    refit_loader_gsf_of(l, i, keys, gsf);
  return st;
}

refit_status_t refit_loader_verify(refit_loader_t *l, refit_source_t *src,
                                   uint64_t version, int64_t *mismatches) {
  refit_status_t st = REFIT_OK;
  int64_t bad = 0;
  size_t scratch_bytes = 0;
  uint8_t *scratch = NULL;

  /* One scratch area sized for the largest tensor: expected BF16, its
   * canonical MXFP8, and the expected runtime layout. */
  for (int64_t i = 0; i < l->ntensors; i++) {
    const refit_gen_tensor_t *g = &l->cat->gen[l->first + i];
    const refit_store_t *w = &l->stores[l->store_of[i]];
    size_t need = (size_t)(g->rows * g->cols) * 2;
    if (g->quantized == REFIT_QUANT_FP8_BLOCK)
      need += w[0].bytes + w[1].bytes + 512 +
              (refit_loader_has_dequant(g) ? w[2].bytes + 256 : 0);
    else if (g->quantized == REFIT_QUANT_NVFP4)
      need += (size_t)(g->rows * refit_nvfp4_scale_cols(g->cols)) +
              (size_t)(g->rows * refit_nvfp4_row_bytes(g->cols)) + w[0].bytes +
              w[1].bytes + w[2].bytes + 1280;
    else if (g->quantized)
      need += (size_t)refit_loader_assembly_bytes(g) + w[0].bytes + w[1].bytes + 1024;
    if (need > scratch_bytes)
      scratch_bytes = need;
  }
  int32_t *keys = malloc((size_t)(l->cat->nhf ? l->cat->nhf : 1) * sizeof(*keys));
  if (keys == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "verify: amax keys");
  for (int64_t h = 0; h < l->cat->nhf; h++)
    keys[h] = -1;
  REFIT_CHECK_GOTO(refit_mem_alloc(l->mem, scratch_bytes, (void **)&scratch), st, out);
  for (int64_t i = 0; i < l->ntensors && st == REFIT_OK; i++) {
    const refit_gen_tensor_t *g = &l->cat->gen[l->first + i];
    const refit_store_t *w = &l->stores[l->store_of[i]];
    uint16_t *want = (uint16_t *)scratch;
    REFIT_CHECK_GOTO(refit_loader_expected(l, src, version, i, want), st, out);
    if (!g->quantized) {
      REFIT_CHECK_GOTO(refit_loader_compare(l, w, want, 2, version, &bad), st, out);
      continue;
    }
    if (g->quantized == REFIT_QUANT_NVFP4) {
      uint8_t *lin = scratch + ((size_t)(g->rows * g->cols) * 2 + 255) / 256 * 256;
      uint8_t *packed =
          lin + ((size_t)(g->rows * refit_nvfp4_scale_cols(g->cols)) + 255) / 256 * 256;
      uint8_t *w_out =
          packed + ((size_t)(g->rows * refit_nvfp4_row_bytes(g->cols)) + 255) / 256 * 256;
      uint8_t *s_out = w_out + (w[0].bytes + 255) / 256 * 256;
      uint8_t *s2_out = s_out + (w[1].bytes + 255) / 256 * 256;
      float *gsf = malloc((size_t)refit_block_matrices(g) * sizeof(float));
      if (gsf == NULL) {
        st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "verify: global scales of %s", g->name);
        goto out;
      }
      st = refit_loader_verify_gsf(l, src, version, i, keys, gsf);
      if (st == REFIT_OK)
        st = refit_loader_nvfp4(l, i, gsf, want, lin, packed, w_out, s_out,
                                (float *)(void *)s2_out);
      free(gsf);
      if (st != REFIT_OK)
        goto out;
      REFIT_CHECK_GOTO(refit_loader_compare(l, &w[0], w_out, 1, version, &bad), st, out);
      REFIT_CHECK_GOTO(refit_loader_compare(l, &w[1], s_out, 1, version, &bad), st, out);
      REFIT_CHECK_GOTO(refit_loader_compare(l, &w[2], s2_out, 4, version, &bad), st, out);
      continue;
    }
    if (g->quantized == REFIT_QUANT_FP8_BLOCK) {
      uint8_t *w_out = scratch + ((size_t)(g->rows * g->cols) * 2 + 255) / 256 * 256;
      uint8_t *s_out = w_out + (w[0].bytes + 255) / 256 * 256;
      REFIT_CHECK_GOTO(
          refit_loader_transform(l, i, (const uint8_t *)want, NULL, w_out, s_out), st,
          out);
      REFIT_CHECK_GOTO(refit_loader_compare(l, &w[0], w_out, 1, version, &bad), st, out);
      REFIT_CHECK_GOTO(refit_loader_compare(l, &w[1], s_out, 4, version, &bad), st, out);
      if (refit_loader_has_dequant(g)) {
        uint16_t *d_out = (uint16_t *)(void *)(s_out + (w[1].bytes + 255) / 256 * 256);
        REFIT_CHECK_GOTO(
            refit_loader_fp8_dequant(l, i, w_out, (const float *)(void *)s_out, d_out), st,
            out);
        REFIT_CHECK_GOTO(refit_loader_compare(l, &w[2], d_out, 2, version, &bad), st, out);
      }
      continue;
    }
    /* The whole tensor at once, unlike the data path's chunk by chunk. */
    uint8_t *q = scratch + ((size_t)(g->rows * g->cols) * 2 + 255) / 256 * 256;
    uint8_t *scale = q + g->rows * g->cols;
    uint8_t *w_out = q + (refit_loader_assembly_bytes(g) + 255) / 256 * 256;
    uint8_t *s_out = w_out + (w[0].bytes + 255) / 256 * 256;
    REFIT_CHECK_GOTO(refit_mem_zero(l->mem, w_out, w[0].bytes), st, out);
    REFIT_CHECK_GOTO(refit_mem_zero(l->mem, s_out, w[1].bytes), st, out);
    REFIT_CHECK_GOTO(refit_mem_quantize_rows(l->mem, want, g->rows, g->cols, q, scale),
                     st, out);
    REFIT_CHECK_GOTO(refit_loader_transform(l, i, q, scale, w_out, s_out), st, out);
    REFIT_CHECK_GOTO(refit_loader_compare(l, &w[0], w_out, 1, version, &bad), st, out);
    REFIT_CHECK_GOTO(refit_loader_compare(l, &w[1], s_out, 1, version, &bad), st, out);
  }
out:
  if (scratch != NULL)
    refit_mem_free(l->mem, scratch);
  free(keys);
  *mismatches = bad;
  return st;
}

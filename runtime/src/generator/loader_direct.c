/*
 * The generator loader's zero-copy path (refit.zero_copy; kernels/direct.h):
 * each chunk read where its trainer holds it, on this rank's GPU, and written
 * straight to its final place in the runtime layout. No staging rows and no
 * layout pass; the bucket's "staging" holds only the trainer's 8-byte sealed
 * digests of its chunks.
 *
 * Block FP8 and NVFP4. A block FP8 chunk of whole 128 x 128 blocks (the
 * tensors the plan marks prequantized, refit.prequantize) is quantized from
 * the trainer's rows straight into weight and weight_scale_inv
 * (BLOCK_QUANTIZE). Every other tensor of these precisions is copied into
 * its area of the assembly arena (the one the staged path plans) and
 * quantized once whole, as the staged path does: runs end where such a
 * tensor completes, so that its quantization is queued before the area is
 * reused.
 */
#include "generator/loader.h"

#include "core/digest.h"
#include "core/error.h"
#include "kernels/layout.h"

#include <stdlib.h>
#include <string.h>

int refit_loader_direct_layout(const refit_loader_t *l, const refit_gen_tensor_t *g,
                               const refit_store_t *w, refit_direct_desc_t *d) {
  d->dst = w[0].target;
  d->scale = w[1].target;
  d->k = g->cols;
  d->perm = -1;
  d->group_rows = d->perm_rows = g->rows;
  if (g->kind == REFIT_GEN_LINEAR) {
    int perm;
    d->perm_rows = refit_kernels_dense_rows(
        (refit_kernels_dense_backend_t)l->cfg->refit.linear_backend, g->rows, &perm);
    d->perm = perm;
  } else {
    /* The expert layout's rows and permutation, as the transform takes them. */
    const int64_t e = g->shape[0];
    const refit_kernels_moe_shape_t m = refit_loader_moe_shape(g);
    int64_t rows, k;
    refit_kernels_perm_kind_t kind;
    refit_kernels_moe_tensor_dims(&m, g->kind == REFIT_GEN_MOE_W13 ? REFIT_KERNELS_MOE_W13
                                                                  : REFIT_KERNELS_MOE_W2,
                                  &rows, &k, &kind);
    d->group_rows = d->perm_rows = rows;
    d->perm = kind;
    d->value_group_bytes = (int64_t)w[0].bytes / e;
    d->scale_group_bytes = (int64_t)w[1].bytes / e;
  }
  return d->perm_rows > d->group_rows || d->perm_rows % 128 != 0 || (g->cols / 32) % 4 != 0;
}

refit_status_t refit_loader_direct_tables(refit_loader_t *l, const uint16_t *const *bases,
                                          int64_t nsrc) {
  const refit_plan_t *p = l->plan;
  const refit_catalog_t *cat = l->cat;
  int64_t n = 0, *order = NULL;
  refit_status_t st = REFIT_OK;
  refit_loader_release(l);
  REFIT_CHECK(refit_plan_land_order(p, l->generator_rank, &order, &n));
  refit_direct_desc_t *descs = calloc((size_t)(n + l->ntensors + 1), sizeof(*descs));
  l->desc_tensor = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
  l->desc_chunk = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
  l->land_begin = calloc((size_t)p->nbuckets + 2, sizeof(int64_t));
  l->desc_completes = calloc((size_t)(n ? n : 1), 1);
  int64_t *base = malloc((size_t)(p->nbuckets ? p->nbuckets : 1) * sizeof(int64_t));
  int64_t *seen = calloc((size_t)(l->ntensors ? l->ntensors : 1), sizeof(int64_t));
  if (descs == NULL || l->desc_tensor == NULL || l->desc_chunk == NULL ||
      l->land_begin == NULL || l->desc_completes == NULL || base == NULL || seen == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "zero-copy tables of %lld chunks", (long long)n);
    goto out;
  }
  /* The assembly arena of block FP8 and NVFP4 tensors that are not landed
   * block by block (reshard/plan.h), as the staged path plans it. */
  int64_t top = 0;
  REFIT_CHECK_GOTO(refit_plan_assembly(p, cat, l->generator_rank, l->arena_off, &top), st,
                   out);
  l->arena_bytes = top;
  if (top > 0)
    REFIT_CHECK_GOTO(refit_mem_alloc(l->mem, (size_t)top, (void **)&l->arena), st, out);
  /* A bucket's digests sit in plan order of its chunks to this rank: its
   * messages are contiguous in the plan (sorted by bucket, receiver, sender),
   * and so are their chunks. */
  for (int32_t b = 0; b < p->nbuckets; b++)
    base[b] = -1;
  for (int64_t o = 0; o < n; o++) {
    const refit_chunk_t *ch = &p->chunks[order[o]];
    if (base[ch->bucket] < 0 || order[o] < base[ch->bucket])
      base[ch->bucket] = order[o];
  }
  for (int64_t o = 0; o < n; o++) {
    const int64_t c = order[o];
    const refit_chunk_t *ch = &p->chunks[c];
    const int64_t i = ch->dst_tensor - l->first;
    const refit_gen_tensor_t *g = &cat->gen[ch->dst_tensor];
    const refit_store_t *w = &l->stores[l->store_of[i]];
    const uint16_t *shard = bases[(int64_t)ch->src_rank * nsrc + ch->src_tensor];
    int64_t shard_rows, shard_cols;
    refit_src_shard_shape(&cat->src[ch->src_tensor], &shard_rows, &shard_cols);
    refit_direct_desc_t *d = &descs[o];
    d->src = shard + ch->src_row * shard_cols + ch->src_col;
    d->src_pitch = shard_cols * 2;
    d->rows = ch->rows;
    d->cols = ch->cols;
    d->digest = l->trailer > 0;
    d->seal_key =
        refit_seal_key(l->run_id, ch->bucket, ch->src_tensor, ch->src_row, ch->src_col);
    d->digest_offset = 8 * (c - base[ch->bucket]);
    if (refit_plan_block_prequantized(p, ch->dst_tensor)) {
      /* Whole blocks: quantized from the trainer's rows into place. */
      d->op = REFIT_DIRECT_BLOCK_QUANTIZE;
      d->perm = -1;
      refit_loader_block_place(l, ch, &d->dst, &d->dst_pitch, &d->scale, &d->scale_pitch);
      d->fp8_scale = (int32_t)l->cfg->refit.fp8_scale;
    } else if (refit_plan_assembles(g)) {
      /* BF16 rows into the tensor's assembly area. */
      d->op = REFIT_DIRECT_COPY;
      d->perm = -1;
      d->dst = l->arena + l->arena_off[i] + (ch->dst_row * g->cols + ch->dst_col) * 2;
      d->dst_pitch = g->cols * 2;
      seen[i] += ch->rows * ch->cols;
      l->desc_completes[o] = seen[i] == g->elements;
    } else if (g->quantized) {
      refit_loader_direct_layout(l, g, w, d);
      d->op = REFIT_DIRECT_QUANTIZE;
      d->row0 = ch->dst_row;
      d->col0 = ch->dst_col;
    } else {
      d->op = REFIT_DIRECT_COPY;
      d->perm = -1;
      d->dst = (uint8_t *)w[0].target + (ch->dst_row * g->cols + ch->dst_col) * 2;
      d->dst_pitch = g->cols * 2;
    }
    l->desc_tensor[o] = i;
    l->desc_chunk[o] = c;
    l->land_begin[ch->bucket + 1] = o + 1;
  }
  for (int32_t b = 1; b <= p->nbuckets; b++)
    if (l->land_begin[b] < l->land_begin[b - 1])
      l->land_begin[b] = l->land_begin[b - 1];
  /* The padding of every quantized tensor that has some, after the chunks:
   * written (as 0) with the first bucket. */
  int64_t k = n;
  for (int64_t i = 0; i < l->ntensors; i++) {
    const refit_gen_tensor_t *g = &cat->gen[l->first + i];
    if (!g->quantized || refit_plan_assembles(g))
      continue; /* block FP8 and NVFP4: their quantizers write the padding */
    refit_direct_desc_t *d = &descs[k];
    if (!refit_loader_direct_layout(l, g, &l->stores[l->store_of[i]], d)) {
      memset(d, 0, sizeof(*d));
      continue;
    }
    d->op = REFIT_DIRECT_PAD;
    d->rows = g->kind == REFIT_GEN_LINEAR ? 1 : g->shape[0];
    k++;
  }
  l->direct_pads = k - n;
  refit_direct_number_blocks(descs, k);
  REFIT_CHECK_GOTO(refit_direct_descs_check(descs, k), st, out);
  int64_t most = l->direct_pads, max_runs = 0;
  for (int32_t b = 0; b < p->nbuckets; b++) {
    int64_t runs = 3; /* the last run, the padding, a duplicate from the fault seam */
    for (int64_t o = l->land_begin[b]; o < l->land_begin[b + 1]; o++)
      runs += l->desc_completes[o];
    if (runs > max_runs)
      max_runs = runs;
    if (l->land_begin[b + 1] - l->land_begin[b] > most)
      most = l->land_begin[b + 1] - l->land_begin[b];
  }
  REFIT_CHECK_GOTO(refit_mem_land_reserve(l->mem, max_runs > 3 ? max_runs : 3), st, out);
  REFIT_CHECK_GOTO(refit_mem_alloc(l->mem, (size_t)(most + 1) * 8, &l->direct_acc), st, out);
  l->land.host = descs;
  l->land.count = k;
  descs = NULL;
  REFIT_CHECK_GOTO(refit_mem_table_upload(l->mem, &l->land, sizeof(refit_direct_desc_t)), st,
                   out);
out:
  free(order);
  free(descs);
  free(base);
  free(seen);
  return st;
}

refit_status_t refit_loader_land_direct(refit_loader_t *l, int32_t b, unsigned char *digests,
                                        uint64_t tag, refit_land_fault_t fault) {
  fault = refit_land_fault(fault);
  int64_t first = l->land_begin[b], end = l->land_begin[b + 1], runs = 0, bad = -1;
  const refit_direct_desc_t *descs = l->land.host;
  const int64_t npad = b == 0 ? l->direct_pads : 0, pad0 = l->land.count - l->direct_pads;
  if (first == end && npad == 0)
    return REFIT_OK;
  if (fault == REFIT_LAND_FLIP_ONE && first < end && descs[first].digest) {
    /* A damaged digest on the way: the chunk must fail its check. */
    unsigned char byte;
    unsigned char *at = digests + descs[first].digest_offset + 3;
    REFIT_CHECK(refit_mem_to_host(l->mem, &byte, at, 1));
    byte ^= 0x10;
    REFIT_CHECK(refit_mem_from_host(l->mem, at, &byte, 1));
  }
  if (fault == REFIT_LAND_DROP_ONE && first < end)
    first++;
  /* Stores written in place for the first time this refit are saved first:
   * here a quantized tensor is written chunk by chunk, so at its first. */
  for (int64_t k = first; k < end; k++) {
    refit_store_t *w = &l->stores[l->store_of[l->desc_tensor[k]]];
    REFIT_CHECK(refit_loader_touch(l, &w[0]));
    if (l->cat->gen[l->first + l->desc_tensor[k]].quantized)
      REFIT_CHECK(refit_loader_touch(l, &w[1]));
  }
  for (int64_t i = 0; i < l->ntensors && npad > 0; i++)
    if (l->cat->gen[l->first + i].quantized) {
      REFIT_CHECK(refit_loader_touch(l, &l->stores[l->store_of[i]]));
      REFIT_CHECK(refit_loader_touch(l, &l->stores[l->store_of[i] + 1]));
    }
  if (npad > 0)
    REFIT_CHECK(refit_mem_direct_run(l->mem, &l->land, pad0, npad, tag, NULL, l->direct_acc,
                                     -1));
  /* Runs that end where a tensor in the arena completes: its quantization
   * (refit_loader_account) is queued before a later run reuses its area. */
  int64_t start = first;
  for (int64_t k = first; k < end; k++) {
    if (!l->desc_completes[k] && k + 1 < end)
      continue;
    REFIT_CHECK(refit_mem_direct_run(l->mem, &l->land, start, k + 1 - start, tag, digests,
                                     l->direct_acc, runs++));
    if (fault == REFIT_LAND_DUPLICATE_ONE && start == first) {
      REFIT_CHECK(refit_mem_direct_run(l->mem, &l->land, first, 1, tag, digests,
                                       l->direct_acc, runs++));
      REFIT_CHECK(refit_loader_account(l, first));
    }
    for (int64_t j = start; j <= k; j++)
      REFIT_CHECK(refit_loader_account(l, j));
    start = k + 1;
  }
  REFIT_CHECK(refit_mem_land_collect(l->mem, runs, &bad));
  if (bad >= 0) {
    char what[REFIT_NAME_MAX + 160];
    refit_loader_chunk_str(l, bad, what, sizeof(what));
    return REFIT_ERR(REFIT_ERR_INTEGRITY,
                     "digest mismatch in %s, read in place from the trainer's memory: the "
                     "rows are not what the trainer sealed for this refit (changed since, "
                     "another refit's, or a damaged digest)",
                     what);
  }
  return refit_mem_sync(l->mem);
}

/*
 * The generator loader's zero-copy path (refit.zero_copy; kernels/direct.h):
 * each chunk read where its trainer holds it, on this rank's GPU, and written
 * straight to its final place in the runtime layout. No staging rows, no
 * assembly arena, no layout pass; the bucket's "staging" holds only the
 * trainer's 8-byte sealed digests of its chunks.
 */
#include "loader.h"

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
  int64_t *base = malloc((size_t)(p->nbuckets ? p->nbuckets : 1) * sizeof(int64_t));
  if (descs == NULL || l->desc_tensor == NULL || l->desc_chunk == NULL ||
      l->land_begin == NULL || base == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "zero-copy tables of %lld chunks", (long long)n);
    goto out;
  }
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
    if (g->quantized) {
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
    if (!g->quantized)
      continue;
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
  REFIT_CHECK_GOTO(refit_direct_descs_check(descs, k), st, out);
  int64_t most = l->direct_pads;
  for (int32_t b = 0; b < p->nbuckets; b++)
    if (l->land_begin[b + 1] - l->land_begin[b] > most)
      most = l->land_begin[b + 1] - l->land_begin[b];
  REFIT_CHECK_GOTO(refit_mem_land_reserve(l->mem, 3), st, out);
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
  return st;
}

refit_status_t refit_loader_land_direct(refit_loader_t *l, int32_t b, unsigned char *digests,
                                        uint64_t tag, refit_land_fault_t fault) {
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
  REFIT_CHECK(refit_mem_direct_run(l->mem, &l->land, first, end - first, tag, digests,
                                   l->direct_acc, runs++));
  if (fault == REFIT_LAND_DUPLICATE_ONE && first < end) {
    REFIT_CHECK(refit_mem_direct_run(l->mem, &l->land, first, 1, tag, digests, l->direct_acc,
                                     runs++));
    REFIT_CHECK(refit_loader_account(l, first));
  }
  if (npad > 0)
    REFIT_CHECK(refit_mem_direct_run(l->mem, &l->land, pad0, npad, tag, NULL, l->direct_acc,
                                     -1));
  for (int64_t k = first; k < end; k++)
    REFIT_CHECK(refit_loader_account(l, k));
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

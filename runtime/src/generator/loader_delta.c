/*
 * Delta refits applied in place (issue "Delta refit"; delta_wire.h states the
 * design): a generator whose chunks all land bytewise (BF16 rows into their
 * store, MXFP8 or block FP8 quantized on the trainer) writes each changed
 * byte of a delta straight to its runtime place, and checks a chunk's digest
 * from the committed one and the words the delta touches (the digest is a
 * sum of per-word terms, core/digest.h), so a delta refit reads and writes
 * only what changed and keeps no copy of the wire bytes. The walk over a
 * delta and its places is kernels/place.h's; this file adds the session's
 * side: which descriptor a chunk is, the committed digests and their seal,
 * saving a store before its first write, the counts, and what follows a
 * tensor's last chunk (MLA's dequantized copy of a block FP8 kv_b_proj).
 */
#include "generator/loader.h"

#include "core/digest.h"
#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>

/* The message, chunk and tensor (descriptor k) in front of the error
 * recorded last. */
static refit_status_t refit_ld_fail(const refit_loader_t *l, int64_t k, refit_status_t st,
                                    const char *what, int64_t index, int64_t count,
                                    const char *tail) {
  char why[512], tensor[REFIT_NAME_MAX + 160];
  snprintf(why, sizeof(why), "%s", refit_last_error());
  refit_loader_chunk_str(l, k, tensor, sizeof(tensor));
  return REFIT_ERR(st, "%s, chunk %lld of %lld (%s): %s%s", what, (long long)index,
                   (long long)count, tensor, why, tail);
}

/* The undo log's capacity for n more entries, a log of `cap` entries now
 * (`first`: its first size): -1 when there is no room (async, restore other
 * than full, or past undo_max), cap when it fits, else the doubled size. */
static int64_t refit_loader_undo_want(const refit_loader_t *l, int64_t n, int64_t cap,
                                      int64_t first) {
  if (l->cfg->refit.mode == REFIT_MODE_ASYNC || l->cfg->refit.restore != REFIT_RESTORE_FULL ||
      l->nundo + n > l->undo_max)
    return -1;
  if (l->nundo + n <= cap)
    return cap;
  int64_t want = cap > 0 ? 2 * cap : first;
  while (want < l->nundo + n)
    want *= 2;
  return want < l->undo_max ? want : l->undo_max;
}

/* Room in the undo log for n more entries (sync, restore: full only)? */
static int refit_loader_undo_room(refit_loader_t *l, int64_t n) {
  const int64_t cap = refit_loader_undo_want(l, n, l->undo_cap, 4096);
  if (cap < 0)
    return 0;
  if (cap == l->undo_cap)
    return 1;
  uint8_t **at = realloc(l->undo_at, (size_t)cap * sizeof(*at));
  if (at == NULL)
    return 0;
  l->undo_at = at;
  uint8_t *old = realloc(l->undo_old, (size_t)cap);
  if (old == NULL)
    return 0;
  l->undo_old = old;
  l->undo_cap = cap;
  return 1;
}

refit_status_t refit_loader_delta_chunk(refit_loader_t *l, int64_t c,
                                        const unsigned char *bytes, size_t len, int full,
                                        uint64_t tag, const char *what, int64_t index,
                                        int64_t count) {
  const int64_t k = c >= 0 && c < l->plan->nchunks ? l->chunk_desc[c] : -1;
  if (!l->in_place || k < 0)
    return REFIT_ERR(REFIT_ERR_INTERNAL,
                     "%s, chunk %lld of %lld: plan chunk %lld is not one this generator "
                     "applies in place",
                     what, (long long)index, (long long)count, (long long)c);
  const refit_land_desc_t *d = &((const refit_land_desc_t *)l->land.host)[k];
  const refit_chunk_t *ch = &l->plan->chunks[c];
  const int64_t i = l->desc_tensor[k];
  refit_place_chunk_t pc;
  REFIT_CHECK(refit_place_chunk(&l->place[i], ch->dst_row, ch->dst_col, ch->rows, ch->cols,
                                &pc));
  /* Check: nothing is written before the whole chunk is known good. */
  const int digest = l->trailer == 8;
  const uint64_t old_sum = digest ? l->sum[0][k] : 0;
  refit_place_delta_t r;
  refit_status_t st =
      refit_place_delta_check(&pc, l->trailer, old_sum,
                              old_sum + refit_seal(d->seal_key, l->sum_tag), bytes, len,
                              full, &r);
  if (st == REFIT_OK && digest && r.trailer != r.sum + refit_seal(d->seal_key, tag))
    st = REFIT_ERR(REFIT_ERR_INTEGRITY,
                   "digest mismatch: its trailer after the %s delta is %016llx, the "
                   "committed digest and the %llu changed bytes make %016llx",
                   r.encoding, (unsigned long long)r.trailer, (unsigned long long)r.changed,
                   (unsigned long long)(r.sum + refit_seal(d->seal_key, tag)));
  if (st != REFIT_OK)
    return refit_ld_fail(l, k, REFIT_ERR_INTEGRITY, what, index, count,
                         "; nothing of it was written, the refit is discarded");

  /* Write. */
  REFIT_CHECK(refit_loader_count(l, k));
  const int completes = l->filled[i] == l->cat->gen[l->first + i].elements;
  uint64_t written = 0;
  if (r.changed > 0) {
    uint8_t **undo_at = NULL;
    uint8_t *undo_old = NULL;
    if (refit_loader_undo_room(l, (int64_t)r.changed)) {
      undo_at = l->undo_at + l->nundo;
      undo_old = l->undo_old + l->nundo;
      l->touched = 1;
    } else { /* async, restore: none, or the log full: as a full refit */
      refit_store_t *s = &l->stores[l->store_of[i]];
      REFIT_CHECK(refit_loader_touch(l, &s[0]));
      if (l->cat->gen[l->first + i].quantized)
        REFIT_CHECK(refit_loader_touch(l, &s[1]));
    }
    REFIT_CHECK(refit_place_delta_write(&pc, l->trailer, bytes, len, full, undo_at,
                                        undo_old, &written));
    if (undo_at != NULL)
      l->nundo += (int64_t)written;
  }
  if (written != r.changed) {
    REFIT_ERR(REFIT_ERR_INTERNAL, "wrote %llu of the %llu changed bytes",
              (unsigned long long)written, (unsigned long long)r.changed);
    return refit_ld_fail(l, k, REFIT_ERR_INTERNAL, what, index, count, "");
  }
  l->changed_bytes += r.changed;
  l->written_bytes += written;
  if (digest)
    l->sum[1][k] = r.sum;
  l->cand_tag = tag;
  /* A block FP8 tensor with MLA's dequantized copy rewrites it once its
   * last chunk is applied. */
  return completes ? refit_loader_complete(l, i) : REFIT_OK;
}

/* Room in the GPU undo log for n more entries (sync, restore: full only):
 * grown by doubling, the entries so far copied over. */
static int refit_loader_undo_room_gpu(refit_loader_t *l, int64_t n) {
  const int64_t cap = refit_loader_undo_want(l, n, l->undo_dev_cap, 65536);
  if (cap < 0)
    return 0;
  if (cap == l->undo_dev_cap)
    return 1;
  void *at = NULL, *old = NULL;
  if (refit_mem_alloc(l->mem, (size_t)cap * 8, &at) != REFIT_OK)
    return 0;
  if (refit_mem_alloc(l->mem, (size_t)cap, &old) != REFIT_OK ||
      (l->nundo > 0 &&
       (refit_mem_copy(l->mem, at, l->undo_dev_at, (size_t)l->nundo * 8) != REFIT_OK ||
        refit_mem_copy(l->mem, old, l->undo_dev_old, (size_t)l->nundo) != REFIT_OK)) ||
      refit_mem_sync(l->mem) != REFIT_OK) {
    refit_mem_free(l->mem, at);
    if (old != NULL)
      refit_mem_free(l->mem, old);
    return 0;
  }
  if (l->undo_dev_at != NULL) {
    refit_mem_free(l->mem, l->undo_dev_at);
    refit_mem_free(l->mem, l->undo_dev_old);
  }
  l->undo_dev_at = at;
  l->undo_dev_old = old;
  l->undo_dev_cap = cap;
  return 1;
}

refit_status_t refit_loader_delta_gpu(refit_loader_t *l, const refit_loader_gpu_chunk_t *c,
                                      int64_t n, uint64_t tag, int64_t *bad) {
  *bad = -1;
  if (n <= 0)
    return REFIT_OK;
  if (n > l->gpu_cap) {
    free(l->gpu_chunks);
    free(l->gpu_outs);
    free(l->gpu_hosts);
    free(l->gpu_completes);
    l->gpu_cap = 0;
    l->gpu_chunks = malloc((size_t)n * sizeof(*l->gpu_chunks));
    l->gpu_outs = malloc((size_t)n * sizeof(*l->gpu_outs));
    l->gpu_hosts = malloc((size_t)n * sizeof(*l->gpu_hosts));
    l->gpu_completes = malloc((size_t)n);
    if (l->gpu_chunks == NULL || l->gpu_outs == NULL || l->gpu_hosts == NULL ||
        l->gpu_completes == NULL)
      return REFIT_ERR(REFIT_ERR_NO_MEMORY, "in-place delta batch of %lld chunks",
                       (long long)n);
    l->gpu_cap = n;
  }
  const int digest = l->trailer == 8;
  const refit_land_desc_t *descs = l->land.host;
  for (int64_t j = 0; j < n; j++) {
    const int64_t k = c[j].chunk >= 0 && c[j].chunk < l->plan->nchunks
                          ? l->chunk_desc[c[j].chunk]
                          : -1;
    *bad = j;
    if (!l->in_place || k < 0)
      return REFIT_ERR(REFIT_ERR_INTERNAL,
                       "plan chunk %lld is not one this generator applies in place",
                       (long long)c[j].chunk);
    const refit_chunk_t *ch = &l->plan->chunks[c[j].chunk];
    const int64_t i = l->desc_tensor[k];
    refit_place_chunk_t pc;
    REFIT_CHECK(
        refit_place_chunk(&l->place[i], ch->dst_row, ch->dst_col, ch->rows, ch->cols, &pc));
    /* A chunk twice in a refit: a batch checks every chunk against the bytes
     * before any write, so a repeat would pass and write twice. */
    if (l->gpu_seen[k])
      return REFIT_ERR(REFIT_ERR_INTEGRITY,
                       "the chunk arrived a second time in this refit: a duplicate");
    l->gpu_seen[k] = 1;
    REFIT_CHECK(refit_loader_count(l, k));
    l->gpu_completes[j] = l->filled[i] == l->cat->gen[l->first + i].elements;
    l->gpu_chunks[j] = (refit_place_cuda_chunk_t){
        .t = l->place[i],
        .row0 = pc.row0,
        .col0 = pc.col0,
        .rows = pc.rows,
        .cols = pc.cols,
        .row_bytes = pc.row_bytes,
        .bytes = c[j].dev,
        .len = c[j].len,
        .full = c[j].full,
        .trailer_bytes = l->trailer,
        .old_trailer = digest ? l->sum[0][k] + refit_seal(descs[k].seal_key, l->sum_tag) : 0};
    l->gpu_hosts[j] = c[j].host;
  }
  /* Check: every chunk of the batch, its digest included, before any write. */
  REFIT_CHECK(refit_mem_place_check(l->mem, l->gpu_chunks, l->gpu_hosts, n, l->gpu_outs, bad));
  uint64_t changed = 0;
  for (int64_t j = 0; j < n; j++) {
    const refit_place_cuda_out_t *o = &l->gpu_outs[j];
    const int64_t k = l->chunk_desc[c[j].chunk];
    const uint64_t want = l->sum[0][k] + o->sum + refit_seal(descs[k].seal_key, tag);
    if (digest && o->trailer != want) {
      *bad = j;
      return REFIT_ERR(REFIT_ERR_INTEGRITY,
                       "digest mismatch: its trailer after the %s is %016llx, the "
                       "committed digest and the %llu changed bytes make %016llx",
                       c[j].full ? "whole chunk" : "delta", (unsigned long long)o->trailer,
                       (unsigned long long)o->changed, (unsigned long long)want);
    }
    changed += o->changed;
  }
  *bad = -1;
  /* Write: logged for rollback when the log has room, else the chunks'
   * stores are saved whole first (or, async, the shadow takes the writes). */
  uint64_t *undo_at = NULL;
  uint8_t *undo_old = NULL;
  if (changed > 0 && refit_loader_undo_room_gpu(l, (int64_t)changed)) {
    undo_at = l->undo_dev_at;
    undo_old = l->undo_dev_old;
    l->touched = 1;
  } else if (changed > 0) {
    for (int64_t j = 0; j < n; j++) {
      if (l->gpu_outs[j].changed == 0)
        continue;
      const int64_t i = l->desc_tensor[l->chunk_desc[c[j].chunk]];
      refit_store_t *s = &l->stores[l->store_of[i]];
      REFIT_CHECK(refit_loader_touch(l, &s[0]));
      if (l->cat->gen[l->first + i].quantized)
        REFIT_CHECK(refit_loader_touch(l, &s[1]));
    }
  }
  if (changed > 0) {
    uint64_t end = (uint64_t)l->nundo;
    const refit_status_t st =
        refit_mem_place_write(l->mem, undo_at, undo_old, (uint64_t)l->nundo, l->gpu_outs,
                              &end);
    l->nundo = (int64_t)end; /* what the log holds, before anything else */
    REFIT_CHECK(st);
  }
  for (int64_t j = 0; j < n; j++) {
    const refit_place_cuda_out_t *o = &l->gpu_outs[j];
    if (changed > 0 && o->written != o->changed) {
      *bad = j;
      return REFIT_ERR(REFIT_ERR_INTERNAL,
                       "wrote %llu of the %llu changed bytes (after the bucket's "
                       "write: the refit is discarded and rolled back)",
                       (unsigned long long)o->written, (unsigned long long)o->changed);
    }
    const int64_t k = l->chunk_desc[c[j].chunk];
    if (digest)
      l->sum[1][k] = l->sum[0][k] + o->sum;
  }
  l->changed_bytes += changed; /* each written, as checked above */
  l->written_bytes += changed;
  l->cand_tag = tag;
  /* Tensors whose last chunk this batch applied: MLA's dequantized copy of a
   * block FP8 kv_b_proj (stream-ordered after the write). */
  for (int64_t j = 0; j < n; j++)
    if (l->gpu_completes[j])
      REFIT_CHECK(refit_loader_complete(l, l->desc_tensor[l->chunk_desc[c[j].chunk]]));
  return REFIT_OK;
}

/* Tensor i's place: its stores' targets in its layout. */
static refit_status_t refit_loader_place_of(const refit_loader_t *l, int64_t i,
                                            refit_place_tensor_t *out) {
  const refit_gen_tensor_t *g = &l->cat->gen[l->first + i];
  refit_store_t *s = &l->stores[l->store_of[i]];
  if (!g->quantized)
    return refit_place_bf16_tensor(g->rows, g->cols, s->target, out);
  if (g->quantized == REFIT_QUANT_FP8_BLOCK) {
    /* place.h's scale row of a row is its piece's own (scale_row0 onwards,
     * reshard/blocks.c) when every piece starts on a block row of its
     * matrix, as the config's block rules make them. */
    for (int64_t k = 0; k < l->npieces[i]; k++)
      if (l->pieces[i][k].row0 % REFIT_BLOCK_EDGE != 0)
        return REFIT_ERR(REFIT_ERR_INTERNAL,
                         "%s: piece %lld (rows %lld.. of matrix %lld) starts inside a "
                         "block row: its scales have no in-place delta place",
                         g->name, (long long)k, (long long)l->pieces[i][k].row0,
                         (long long)l->pieces[i][k].matrix);
    return refit_place_fp8_block_tensor(refit_block_matrices(g), g->rows, g->cols,
                                        s[0].target, s[1].target, out);
  }
  if (g->kind == REFIT_GEN_LINEAR)
    return refit_place_dense_tensor((refit_kernels_dense_backend_t)l->cfg->refit.linear_backend,
                                    g->rows, g->cols, s[0].target, s[1].target, out);
  const refit_kernels_moe_shape_t m = refit_loader_moe_shape(g);
  return refit_place_moe_tensor(&m, g->kind == REFIT_GEN_MOE_W13 ? REFIT_KERNELS_MOE_W13
                                                                 : REFIT_KERNELS_MOE_W2,
                                s[0].target, s[1].target, out);
}

refit_status_t refit_loader_delta_tables(refit_loader_t *l) {
  const refit_land_desc_t *descs = l->land.host;
  const int64_t n = l->land.count;
  int ok = l->cfg->refit.delta != REFIT_DELTA_MODE_OFF && !l->direct &&
           (l->trailer == 0 || l->trailer == 8);
  /* Bytewise: BF16 rows copied to their store, MXFP8 or block FP8 rows
   * quantized on the trainer; not BF16 rows into an assembly area. */
  for (int64_t k = 0; ok && k < n; k++)
    ok = (descs[k].op == REFIT_CHUNK_COPY &&
          !refit_plan_assembles(&l->cat->gen[l->first + l->desc_tensor[k]])) ||
         descs[k].op == REFIT_CHUNK_SPLIT || descs[k].op == REFIT_CHUNK_BLOCK_SPLIT;
  l->in_place = ok;
  if (!ok)
    return REFIT_OK;
  l->chunk_desc = malloc((size_t)(l->plan->nchunks ? l->plan->nchunks : 1) *
                         sizeof(*l->chunk_desc));
  if (l->place == NULL)
    l->place = calloc((size_t)(l->ntensors ? l->ntensors : 1), sizeof(*l->place));
  for (int j = 0; j < 2; j++)
    if (l->sum[j] == NULL)
      l->sum[j] = calloc((size_t)(n ? n : 1), sizeof(uint64_t));
  l->nsums = n;
  if (l->gpu_seen == NULL)
    l->gpu_seen = calloc((size_t)(n ? n : 1), 1);
  if (l->chunk_desc == NULL || l->place == NULL || l->sum[0] == NULL || l->sum[1] == NULL ||
      l->gpu_seen == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "in-place delta tables of %lld chunks",
                     (long long)n);
  for (int64_t c = 0; c < l->plan->nchunks; c++)
    l->chunk_desc[c] = -1;
  for (int64_t k = 0; k < n; k++)
    l->chunk_desc[l->desc_chunk[k]] = k;
  for (int64_t i = 0; i < l->ntensors; i++)
    REFIT_CHECK(refit_loader_place_of(l, i, &l->place[i]));
  size_t store_bytes = 0;
  for (int64_t i = 0; i < l->nstores; i++)
    store_bytes += l->stores[i].bytes;
  l->undo_max = (int64_t)(store_bytes / 16);
  return REFIT_OK;
}

refit_status_t refit_loader_delta_note(refit_loader_t *l, int32_t b,
                                       const unsigned char *staging, uint64_t tag) {
  const refit_land_desc_t *descs = l->land.host;
  const int64_t first = l->land_begin[b], n = l->land_begin[b + 1] - first;
  const int device = refit_mem_on_device(l->mem);
  const int sums = l->in_place && l->trailer == 8;
  if (sums && device && n > 0) { /* the bucket's trailers, read back at once */
    if (n > l->trail_cap) {
      free(l->trail_host);
      free(l->trail_pieces);
      if (l->trail_dev != NULL)
        refit_mem_free(l->mem, l->trail_dev);
      l->trail_dev = NULL;
      l->trail_cap = 0;
      l->trail_host = malloc((size_t)n * 8);
      l->trail_pieces = malloc((size_t)n * sizeof(*l->trail_pieces));
      if (l->trail_host == NULL || l->trail_pieces == NULL)
        return REFIT_ERR(REFIT_ERR_NO_MEMORY, "trailers of %lld chunks", (long long)n);
      REFIT_CHECK(refit_mem_alloc(l->mem, (size_t)n * 8, (void **)&l->trail_dev));
      l->trail_cap = n;
    }
    for (int64_t j = 0; j < n; j++)
      l->trail_pieces[j] = (refit_mem_piece_t){
          descs[first + j].src_offset + descs[first + j].rows * descs[first + j].row_bytes,
          l->trail_dev + 8 * j, 8};
    REFIT_CHECK(refit_mem_gather(l->mem, staging, l->trail_pieces, n));
    REFIT_CHECK(refit_mem_to_host(l->mem, l->trail_host, l->trail_dev, (size_t)n * 8));
  }
  for (int64_t k = first; k < first + n; k++) {
    const refit_land_desc_t *d = &descs[k];
    const int64_t rows_len = d->rows * d->row_bytes;
    /* Runtime bytes: a BF16 row quantized here, a block FP8 block row's
     * scales once (not their repeats), else the wire rows as they are. */
    l->written_bytes +=
        (uint64_t)(d->op == REFIT_CHUNK_QUANTIZE ? d->rows * (d->cols + d->cols / 32)
                   : d->op == REFIT_CHUNK_BLOCK_SPLIT
                       ? d->rows * d->cols + (d->rows + REFIT_BLOCK_EDGE - 1) /
                                                 REFIT_BLOCK_EDGE *
                                                 (d->row_bytes - d->cols)
                       : rows_len);
    /* The digest was checked: the trailer is the digest of the rows,
     * sealed with this refit's tag. */
    if (sums)
      l->sum[1][k] = (device ? l->trail_host[k - first]
                             : refit_trailer_load(staging + d->src_offset + rows_len)) -
                     refit_seal(d->seal_key, tag);
  }
  l->cand_tag = tag;
  return REFIT_OK;
}

void refit_loader_delta_commit(refit_loader_t *l) {
  if (!l->in_place)
    return;
  uint64_t *t = l->sum[0];
  l->sum[0] = l->sum[1];
  l->sum[1] = t;
  l->sum_tag = l->cand_tag;
}

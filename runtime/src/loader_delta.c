/*
 * Delta refits applied in place (issue "Delta refit"; delta_wire.h states the
 * design): a generator whose chunks all land bytewise writes each changed
 * byte of a delta straight to its runtime place (kernels/place.h), and checks
 * a chunk's digest from the committed one and the words the delta touches
 * (the digest is a sum of per-word terms, core/digest.h), so a delta refit
 * reads and writes only what changed and keeps no copy of the wire bytes.
 *
 * A chunk's bytes are its rows (rows * row_bytes, each byte at a place in a
 * runtime tensor) and its trailer (the sealed digest: no place; the committed
 * one is recomputed from the committed digest and the committed seal). Every
 * encoding of kernels/delta.h, and a chunk of a message that went whole, is
 * visited as one ordered walk over (offset, new byte); the walk runs twice,
 * once to check (nothing written) and once to write.
 */
#include "loader.h"

#include "core/digest.h"
#include "core/error.h"
#include "kernels/delta.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One chunk being applied. */
typedef struct {
  refit_loader_t *l;
  refit_place_chunk_t pc;
  int64_t rows_len;      /* bytes with a place: rows * row_bytes */
  int64_t span;          /* rows_len + the trailer */
  uint8_t old_trailer[8];
  uint8_t new_trailer[8];
  /* The digest change so far, over whole words of the rows. */
  uint64_t delta_sum;
  int64_t word;      /* the word being gathered, or -1 */
  uint8_t patch[8];  /* its new bytes where `have` says so */
  unsigned have;     /* bit b: byte b of `word` changes */
  uint64_t changed;  /* row bytes that change */
  uint64_t written;
  int write;         /* the second walk: write, do not check */
  /* The first byte the delta names as changed that the destination holds
   * already (a delta made against another baseline), or -1. */
  int64_t same_at;
  const char *encoding;
} refit_ld_chunk_t;

static uint8_t refit_ld_old(const refit_ld_chunk_t *c, int64_t off) {
  return off < c->rows_len ? *refit_place_addr(&c->pc, off, NULL)
                           : c->old_trailer[off - c->rows_len];
}

/* Word w of the rows as runtime storage holds it (the last one zero-padded,
 * as the digest pads it). */
static uint64_t refit_ld_old_word(const refit_ld_chunk_t *c, int64_t w) {
  uint8_t b[8] = {0};
  for (int64_t i = 0; i < 8 && 8 * w + i < c->rows_len; i++)
    b[i] = refit_ld_old(c, 8 * w + i);
  uint64_t v;
  memcpy(&v, b, 8);
  return v;
}

static void refit_ld_flush(refit_ld_chunk_t *c) {
  if (c->word < 0)
    return;
  const uint64_t old = refit_ld_old_word(c, c->word);
  uint8_t b[8];
  memcpy(b, &old, 8);
  for (int i = 0; i < 8; i++)
    if (c->have >> i & 1)
      b[i] = c->patch[i];
  uint64_t now;
  memcpy(&now, b, 8);
  c->delta_sum += refit_digest_term(now, (uint64_t)c->word) -
                  refit_digest_term(old, (uint64_t)c->word);
  c->word = -1;
  c->have = 0;
}

/* The walk's visit of byte `off` set to `v`; `named` when the encoding names
 * this very byte as changed (positions), so that it must differ. */
static void refit_ld_visit(refit_ld_chunk_t *c, int64_t off, uint8_t v, int named) {
  if (off >= c->rows_len) {
    if (named && c->old_trailer[off - c->rows_len] == v && c->same_at < 0)
      c->same_at = off;
    c->new_trailer[off - c->rows_len] = v;
    return;
  }
  uint8_t *at = refit_place_addr(&c->pc, off, NULL);
  if (*at == v) {
    if (named && c->same_at < 0)
      c->same_at = off;
    return;
  }
  if (c->write) {
    *at = v;
    c->written++;
    return;
  }
  c->changed++;
  if (off / 8 != c->word) {
    refit_ld_flush(c);
    c->word = off / 8;
  }
  c->patch[off % 8] = v;
  c->have |= 1u << (off % 8);
}

static uint32_t refit_ld_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

/* Walk the new bytes `bytes` (a delta whose shape refit_delta_info checked,
 * or the whole span when `full`). Positions must increase and lie in the
 * chunk; a marked block must change. */
static refit_status_t refit_ld_walk(refit_ld_chunk_t *c, const uint8_t *bytes, int full,
                                    const refit_delta_info_t *info) {
  if (full || info->encoding == REFIT_DELTA_DENSE) {
    const uint8_t *p = full ? bytes : bytes + REFIT_DELTA_HEADER_BYTES;
    c->encoding = full ? "whole" : "dense";
    /* Runs of consecutive places are compared and written at once. */
    for (int64_t off = 0; off < c->span;) {
      int64_t run = 1;
      if (off < c->rows_len) {
        uint8_t *at = refit_place_addr(&c->pc, off, &run);
        if (memcmp(at, p + off, (size_t)run) == 0) {
          off += run;
          continue;
        }
      }
      for (int64_t i = 0; i < run; i++)
        refit_ld_visit(c, off + i, p[off + i], 0);
      off += run;
    }
    return REFIT_OK;
  }
  const uint8_t *p = bytes + REFIT_DELTA_HEADER_BYTES;
  if (info->encoding == REFIT_DELTA_POSITIONS) {
    c->encoding = "positions";
    const uint8_t *values = p + 4 * (uint64_t)info->count;
    int64_t prev = -1;
    for (uint32_t j = 0; j < info->count; j++) {
      const int64_t off = refit_ld_u32(p + 4 * (uint64_t)j);
      if (off >= c->span || off <= prev)
        return REFIT_ERR(REFIT_ERR_INTEGRITY,
                         "position %u at offset %lld %s", j, (long long)off,
                         off >= c->span ? "lies past the chunk"
                                        : "does not follow the one before");
      refit_ld_visit(c, off, values[j], 1);
      prev = off;
    }
    return REFIT_OK;
  }
  c->encoding = "mask";
  const int64_t nb = (c->span + REFIT_DELTA_BLOCK_BYTES - 1) / REFIT_DELTA_BLOCK_BYTES;
  const uint8_t *data = p + (nb + 7) / 8;
  for (int64_t k = 0; k < nb; k++) {
    if (!(p[k / 8] >> (k % 8) & 1))
      continue;
    const int64_t at = k * REFIT_DELTA_BLOCK_BYTES;
    const int64_t len = c->span - at < REFIT_DELTA_BLOCK_BYTES ? c->span - at
                                                               : REFIT_DELTA_BLOCK_BYTES;
    const uint64_t before = c->changed;
    int trailer_changed = 0;
    for (int64_t i = 0; i < len; i++) {
      trailer_changed |= at + i >= c->rows_len &&
                         c->old_trailer[at + i - c->rows_len] != data[i];
      refit_ld_visit(c, at + i, data[i], 0);
    }
    if (!c->write && c->changed == before && !trailer_changed && c->same_at < 0)
      c->same_at = at;
    data += len;
  }
  return REFIT_OK;
}

/* The message, chunk and tensor in front of the error recorded last. */
static refit_status_t refit_ld_fail(refit_status_t st, const char *what, int64_t index,
                                    int64_t count, const char *tensor, const char *tail) {
  char why[512];
  snprintf(why, sizeof(why), "%s", refit_last_error());
  return REFIT_ERR(st, "%s, chunk %lld of %lld (%s): %s%s", what, (long long)index,
                   (long long)count, tensor, why, tail);
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
  refit_ld_chunk_t w = {.l = l, .word = -1, .same_at = -1};
  REFIT_CHECK(refit_place_chunk(&l->place[i], ch->dst_row, ch->dst_col, ch->rows, ch->cols,
                                &w.pc));
  w.rows_len = d->rows * d->row_bytes;
  w.span = w.rows_len + l->trailer;
  char tensor[REFIT_NAME_MAX + 160];
  refit_loader_chunk_str(l, k, tensor, sizeof(tensor));
  refit_delta_info_t info = {0};
  if (full && len != (size_t)w.span)
    return REFIT_ERR(REFIT_ERR_INTERNAL, "%s, chunk %lld of %lld (%s): %zu bytes, its span "
                     "is %lld", what, (long long)index, (long long)count, tensor, len,
                     (long long)w.span);
  if (!full) {
    refit_status_t st = refit_delta_info(bytes, len, &info);
    if (st == REFIT_OK && info.chunk_bytes != (uint64_t)w.span)
      st = REFIT_ERR(REFIT_ERR_INTEGRITY, "made for a chunk of %u bytes, this one has %lld",
                     info.chunk_bytes, (long long)w.span);
    if (st != REFIT_OK)
      return refit_ld_fail(st, what, index, count, tensor, "");
  }
  const int digest = l->trailer == 8;
  if (digest) {
    const uint64_t old = l->sum[0][k] + refit_seal(d->seal_key, l->sum_tag);
    for (int b = 0; b < 8; b++)
      w.old_trailer[b] = (uint8_t)(old >> (8 * b));
    memcpy(w.new_trailer, w.old_trailer, 8);
  }

  /* Check: nothing is written before the whole chunk is known good. */
  refit_status_t st = refit_ld_walk(&w, bytes, full, &info);
  refit_ld_flush(&w);
  if (st == REFIT_OK && w.same_at >= 0)
    st = REFIT_ERR(REFIT_ERR_INTEGRITY,
                   "its %s delta names byte %lld as changed, but runtime storage holds "
                   "that already: the delta was not made against the committed version",
                   w.encoding, (long long)w.same_at);
  const uint64_t sum = digest ? l->sum[0][k] + w.delta_sum : 0;
  if (st == REFIT_OK && digest) {
    const uint64_t want = sum + refit_seal(d->seal_key, tag);
    const uint64_t got = refit_trailer_load(w.new_trailer);
    if (got != want)
      st = REFIT_ERR(REFIT_ERR_INTEGRITY,
                     "digest mismatch: its trailer after the %s delta is %016llx, the "
                     "committed digest and the %llu changed bytes make %016llx",
                     w.encoding, (unsigned long long)got, (unsigned long long)w.changed,
                     (unsigned long long)want);
  }
  if (st != REFIT_OK)
    return refit_ld_fail(REFIT_ERR_INTEGRITY, what, index, count, tensor,
                         "; nothing of it was written, the refit is discarded");

  /* Write. */
  REFIT_CHECK(refit_loader_count(l, k));
  if (w.changed > 0) {
    refit_store_t *s = &l->stores[l->store_of[i]];
    REFIT_CHECK(refit_loader_touch(l, &s[0]));
    if (l->cat->gen[l->first + i].quantized)
      REFIT_CHECK(refit_loader_touch(l, &s[1]));
  }
  w.write = 1;
  REFIT_CHECK(refit_ld_walk(&w, bytes, full, &info));
  if (w.written != w.changed)
    return REFIT_ERR(REFIT_ERR_INTERNAL, "%s, chunk %lld of %lld (%s): wrote %llu of the "
                     "%llu changed bytes", what, (long long)index, (long long)count,
                     tensor, (unsigned long long)w.written, (unsigned long long)w.changed);
  l->changed_bytes += w.changed;
  l->written_bytes += w.written;
  if (digest)
    l->sum[1][k] = sum;
  l->cand_tag = tag;
  return REFIT_OK;
}

/* Tensor i's place: its stores' targets in its layout. */
static refit_status_t refit_loader_place_of(const refit_loader_t *l, int64_t i,
                                            refit_place_tensor_t *out) {
  const refit_gen_tensor_t *g = &l->cat->gen[l->first + i];
  refit_store_t *s = &l->stores[l->store_of[i]];
  if (!g->quantized)
    return refit_place_bf16_tensor(g->rows, g->cols, s->target, out);
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
           !refit_mem_on_device(l->mem) && (l->trailer == 0 || l->trailer == 8);
  for (int64_t k = 0; ok && k < n; k++)
    ok = descs[k].op == REFIT_CHUNK_COPY || descs[k].op == REFIT_CHUNK_SPLIT;
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
  if (l->chunk_desc == NULL || l->place == NULL || l->sum[0] == NULL || l->sum[1] == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "in-place delta tables of %lld chunks",
                     (long long)n);
  for (int64_t c = 0; c < l->plan->nchunks; c++)
    l->chunk_desc[c] = -1;
  for (int64_t k = 0; k < n; k++)
    l->chunk_desc[l->desc_chunk[k]] = k;
  for (int64_t i = 0; i < l->ntensors; i++)
    REFIT_CHECK(refit_loader_place_of(l, i, &l->place[i]));
  return REFIT_OK;
}

void refit_loader_delta_note(refit_loader_t *l, int32_t b, const unsigned char *staging,
                             uint64_t tag) {
  const refit_land_desc_t *descs = l->land.host;
  for (int64_t k = l->land_begin[b]; k < l->land_begin[b + 1]; k++) {
    const refit_land_desc_t *d = &descs[k];
    const int64_t rows_len = d->rows * d->row_bytes;
    l->written_bytes += (uint64_t)(d->op == REFIT_CHUNK_QUANTIZE
                                       ? d->rows * (d->cols + d->cols / 32)
                                       : rows_len);
    /* The digest was checked: the trailer is the digest of the rows,
     * sealed with this refit's tag. */
    if (l->in_place && l->trailer == 8)
      l->sum[1][k] = refit_trailer_load(staging + d->src_offset + rows_len) -
                     refit_seal(d->seal_key, tag);
  }
  l->cand_tag = tag;
}

void refit_loader_delta_commit(refit_loader_t *l) {
  if (!l->in_place)
    return;
  uint64_t *t = l->sum[0];
  l->sum[0] = l->sum[1];
  l->sum[1] = t;
  l->sum_tag = l->cand_tag;
}

/*
 * The trainer side of a session: which shards this rank holds, producing a
 * version into them from a synthetic or checkpoint source, and the pack
 * descriptor tables that copy (or quantize) chunk rows into the send buffer,
 * bucket by bucket, with each chunk's sealed digest.
 */
#include "session/session.h"
#include "session/path.h"

#include "core/digest.h"
#include "core/log.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Rows [row0, +rows) x cols [col0, +cols) of Hugging Face tensor `hf` of
 * `version` into `dst` (this rank's memory, rows of `cols` elements).
 * Synthetic sources fill device memory on the device; sources that read
 * data go through a host buffer (*bounce, grown as needed). */
static refit_status_t refit_trainer_fill(refit_session_t *s, const refit_src_tensor_t *hf,
                                         uint64_t version, int64_t row0, int64_t col0,
                                         int64_t rows, int64_t cols, uint16_t *dst,
                                         uint16_t **bounce, size_t *bounce_bytes) {
  const int on_device = refit_mem_on_device(s->mem);
  if (on_device && s->source.ops->synth_key != NULL) {
    refit_synth_key_t key;
    REFIT_CHECK(s->source.ops->synth_key(s->source.ctx, hf, version, &key));
    return refit_mem_synth_rect(s->mem, &key, hf->cols, row0, col0, rows, cols, dst);
  }
  if (!on_device)
    return s->source.ops->read(s->source.ctx, hf, version, row0, col0, rows, cols, dst);
  const size_t bytes = (size_t)(rows * cols) * sizeof(uint16_t);
  if (bytes > *bounce_bytes) {
    free(*bounce);
    *bounce = malloc(bytes);
    *bounce_bytes = *bounce != NULL ? bytes : 0;
    if (*bounce == NULL)
      return REFIT_ERR(REFIT_ERR_NO_MEMORY, "source bounce buffer of %zu bytes", bytes);
  }
  REFIT_CHECK(
      s->source.ops->read(s->source.ctx, hf, version, row0, col0, rows, cols, *bounce));
  return refit_mem_from_host(s->mem, dst, *bounce, bytes);
}

/* Trainer: new weights of `version` into every shard this rank holds, from
 * the source's Hugging Face tensors through each trainer tensor's row runs
 * (rows in no run, Megatron's vocabulary padding, become zeros). Not called
 * for source.kind caller: the trainer's tensors are then the caller's. */
refit_status_t refit_trainer_source(refit_session_t *s, uint64_t version) {
  const refit_catalog_t *cat = s->cat;
  uint16_t *bounce = NULL;
  size_t bounce_bytes = 0;
  refit_status_t st = REFIT_OK;
  for (int64_t i = 0; i < cat->nsrc && st == REFIT_OK; i++) {
    if (s->shards[i] == NULL)
      continue;
    const refit_src_tensor_t *t = &cat->src[i];
    int64_t rows, cols;
    refit_src_shard_shape(t, &rows, &cols);
    const int32_t p = s->shard_part[i];
    const int64_t row0 = t->split == REFIT_SPLIT_ROWS ? p * rows : 0;
    const int64_t col0 = t->split == REFIT_SPLIT_COLS ? p * cols : 0;
    int64_t covered = 0;
    for (int64_t k = t->run_begin; k < t->run_begin + t->run_count && st == REFIT_OK;
         k++) {
      const refit_row_run_t *r = &cat->runs[k];
      const int64_t lo = r->src_row > row0 ? r->src_row : row0;
      const int64_t hi =
          r->src_row + r->rows < row0 + rows ? r->src_row + r->rows : row0 + rows;
      if (hi <= lo)
        continue;
      covered += hi - lo;
      st = refit_trainer_fill(s, &cat->hf[r->hf], version, r->hf_row + (lo - r->src_row),
                              col0, hi - lo, cols, s->shards[i] + (lo - row0) * cols,
                              &bounce, &bounce_bytes);
    }
    /* Padding rows are at the end of a tensor (the padded vocabulary). */
    if (st == REFIT_OK && covered < rows)
      st = refit_mem_zero(s->mem, s->shards[i] + covered * cols,
                          (size_t)((rows - covered) * cols) * sizeof(uint16_t));
  }
  free(bounce);
  if (st == REFIT_OK)
    st = refit_mem_sync(s->mem);
  return st;
}

/* The pack operation of chunk ch on this trainer. */
static int refit_trainer_chunk_op(const refit_session_t *s, const refit_chunk_t *ch) {
  if (refit_plan_block_prequantized(s->plan, ch->dst_tensor))
    return REFIT_CHUNK_BLOCK_QUANTIZE;
  return refit_plan_chunk_quantized(s->plan, s->cat, ch) ? REFIT_CHUNK_QUANTIZE
                                                         : REFIT_CHUNK_COPY;
}

/* One pack descriptor per chunk this rank sends, bucket by bucket,
 * against the send buffer layout (messages back to back in plan order). */
refit_status_t refit_trainer_tables(refit_session_t *s) {
  const refit_plan_t *p = s->plan;
  const int64_t nmine = s->my_begin[p->nbuckets];
  int64_t n = 0;
  for (int64_t k = 0; k < nmine; k++)
    n += p->msgs[s->my_msgs[k]].chunk_count;
  refit_pack_desc_t *d = calloc((size_t)(n ? n : 1), sizeof(*d));
  s->pack_begin = calloc((size_t)p->nbuckets + 1, sizeof(int64_t));
  s->msg_wire = calloc((size_t)(nmine ? nmine : 1), sizeof(int64_t));
  s->pack_src = calloc((size_t)(n ? n : 1), sizeof(int64_t));
  s->pack_elem = calloc((size_t)(n ? n : 1), sizeof(int64_t));
  if (d == NULL || s->pack_begin == NULL || s->msg_wire == NULL || s->pack_src == NULL ||
      s->pack_elem == NULL) {
    free(d);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "pack tables of %lld chunks", (long long)n);
  }
  int64_t j = 0;
  for (int32_t b = 0; b < p->nbuckets; b++) {
    int64_t used = 0;
    s->pack_begin[b] = j;
    for (int64_t k = s->my_begin[b]; k < s->my_begin[b + 1]; k++) {
      const refit_msg_t *m = &p->msgs[s->my_msgs[k]];
      int64_t same = -1;
      for (int64_t k0 = s->my_begin[b]; k0 < k && same < 0; k0++)
        if (refit_plan_msgs_same(p, s->cat, &p->msgs[s->my_msgs[k0]], m))
          same = k0;
      if (same >= 0) {
        s->msg_wire[k] = s->msg_wire[same];
        s->shared_msgs++;
        s->shared_bytes += m->bytes;
        continue;
      }
      s->msg_wire[k] = used;
      for (int64_t c = m->chunk_begin; c < m->chunk_begin + m->chunk_count; c++) {
        const refit_chunk_t *ch = &p->chunks[c];
        int64_t shard_rows, shard_cols;
        refit_src_shard_shape(&s->cat->src[ch->src_tensor], &shard_rows, &shard_cols);
        /* Where in its shard, kept so that a tensor registered again at a
         * new address needs only its descriptors rewritten. */
        s->pack_src[j] = ch->src_tensor;
        s->pack_elem[j] = ch->src_row * shard_cols + ch->src_col;
        d[j].src = s->shards[ch->src_tensor] + s->pack_elem[j];
        d[j].src_pitch = shard_cols * 2;
        d[j].dst_offset = used + (ch->offset - m->offset);
        d[j].rows = ch->rows;
        d[j].cols = ch->cols;
        d[j].row_bytes = ch->row_bytes;
        /* Prequantize: MXFP8 blocks never cross rows, and a block FP8
         * chunk is whole blocks (the plan cuts it so), so quantizing chunk
         * by chunk on the trainer equals quantizing the whole tensor. */
        d[j].op = refit_trainer_chunk_op(s, ch);
        d[j].fp8_scale = (int32_t)s->cfg.refit.fp8_scale;
        d[j].digest = p->options.chunk_trailer > 0;
        d[j].seal_key =
            refit_seal_key(s->run_id, b, ch->src_tensor, ch->src_row, ch->src_col);
        j++;
      }
      used += m->bytes;
    }
  }
  s->pack_begin[p->nbuckets] = j;
  if (s->shared_msgs > 0)
    REFIT_INFO("trainer rank %d: %lld of %lld messages repeat an earlier one of "
               "their bucket (%.1f MiB per refit packed once for several "
               "generators)",
               s->role_rank, (long long)s->shared_msgs, (long long)nmine,
               (double)s->shared_bytes / 1048576.0);
  refit_status_t st = refit_pack_descs_check(d, j);
  s->pack.host = d;
  s->pack.count = j;
  if (st == REFIT_OK)
    st = refit_mem_table_upload(s->mem, &s->pack, sizeof(refit_pack_desc_t));
  return st;
}

/* Trainer: point the pack descriptors at the shards' current addresses
 * after refit_tensor_register moved some (Megatron's distributed optimizer
 * frees and re-grows its buffers between steps). No re-planning: only the
 * addresses in the descriptor table change, and the table is copied to the
 * device again. */
refit_status_t refit_trainer_repoint(refit_session_t *s) {
  refit_pack_desc_t *d = s->pack.host;
  for (int64_t j = 0; j < s->pack.count; j++)
    d[j].src = s->shards[s->pack_src[j]] + s->pack_elem[j];
  REFIT_CHECK(refit_pack_descs_check(d, s->pack.count));
  return refit_mem_table_refresh(s->mem, &s->pack, sizeof(refit_pack_desc_t));
}

/* Trainer: pack bucket b into `buf` (messages with the same bytes share
 * them) and list its sends. */
refit_status_t refit_trainer_pack(refit_session_t *s, int32_t b, unsigned char *buf,
                                  refit_xfer_t *xfers, int *nxfers, int wait_done) {
  const refit_plan_t *p = s->plan;
  *nxfers = 0;
  for (int64_t k = s->my_begin[b]; k < s->my_begin[b + 1]; k++) {
    const refit_msg_t *m = &p->msgs[s->my_msgs[k]];
    int64_t at, bytes;
    s->path->msg(s, k, &at, &bytes);
    xfers[*nxfers].peer = s->ntrainer + m->dst_rank;
    xfers[*nxfers].buf = buf + at;
    xfers[*nxfers].bytes = (size_t)bytes;
    xfers[*nxfers].got = NULL;
    (*nxfers)++;
  }
  REFIT_CHECK(s->path->seal(s, b, buf, refit_seal_tag(s->pending, s->attempt)));
  return wait_done ? refit_mem_sync(s->mem) : REFIT_OK;
}

/* Trainer: find the shard of each catalog tensor this rank holds. Memory is
 * attached later (registered by the caller or allocated at bind time). */
refit_status_t refit_session_index_trainer(refit_session_t *s) {
  const refit_catalog_t *cat = s->cat;
  s->shards = calloc((size_t)cat->nsrc, sizeof(*s->shards));
  s->shard_part = malloc((size_t)cat->nsrc * sizeof(*s->shard_part));
  s->shard_owned = calloc((size_t)cat->nsrc, 1);
  if (s->shards == NULL || s->shard_part == NULL || s->shard_owned == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "shard table");
  s->held = malloc((size_t)(cat->nsrc ? cat->nsrc : 1) * sizeof(*s->held));
  s->held_at = malloc((size_t)(cat->nsrc ? cat->nsrc : 1) * sizeof(*s->held_at));
  if (s->held == NULL || s->held_at == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "shard table");
  for (int64_t i = 0; i < cat->nsrc; i++) {
    s->shard_part[i] = refit_src_part_of(cat, &cat->src[i], s->role_rank);
    s->held_at[i] = -1;
    if (s->shard_part[i] >= 0) {
      s->held_at[i] = s->nshards;
      s->held[s->nshards++] = i;
    }
  }
  return REFIT_OK;
}

/*
 * Delta refits on the wire: baselines, frames and the decision's local half
 * (delta_wire.h says what and why).
 */
#include "delta_wire.h"
#include "session.h"

#include "core/digest.h"
#include "core/log.h"
#include "kernels/delta.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void refit_dw_put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t refit_dw_get32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

size_t refit_dw_frame_bound(int64_t bytes, int64_t nchunks) {
  return REFIT_DW_HEADER_BYTES + (size_t)bytes +
         (size_t)nchunks * (4 + REFIT_DELTA_HEADER_BYTES);
}

refit_status_t refit_dw_frame_encode(const unsigned char *now, const unsigned char *base,
                                     const int64_t *span, int64_t n, unsigned char *out,
                                     size_t *len) {
  size_t at = REFIT_DW_HEADER_BYTES;
  const size_t cap = refit_dw_frame_bound(span[n], n);
  for (int64_t i = 0; i < n; i++) {
    size_t dlen = 0;
    const size_t bytes = (size_t)(span[i + 1] - span[i]);
    REFIT_CHECK(refit_delta_encode(now + span[i], base + span[i], bytes, REFIT_DELTA_AUTO,
                                   out + at + 4, cap - at - 4, &dlen, NULL));
    refit_dw_put32(out + at, (uint32_t)dlen);
    at += 4 + dlen;
  }
  refit_dw_put32(out, REFIT_DW_MAGIC);
  refit_dw_put32(out + 4, (uint32_t)n);
  refit_dw_put32(out + 8, (uint32_t)at);
  refit_dw_put32(out + 12, (uint32_t)((uint64_t)at >> 32));
  *len = at;
  return REFIT_OK;
}

refit_status_t refit_dw_frame_walk(const unsigned char *frame, size_t len,
                                   const int64_t *span, int64_t n, const char *what,
                                   refit_dw_chunk_fn fn, void *ctx) {
  if (len < REFIT_DW_HEADER_BYTES || refit_dw_get32(frame) != REFIT_DW_MAGIC)
    return REFIT_ERR(REFIT_ERR_INTEGRITY,
                     "%s: a message of %zu bytes that is neither the full message "
                     "(%lld bytes) nor a delta frame (magic RFDM)",
                     what, len, (long long)span[n]);
  const uint32_t count = refit_dw_get32(frame + 4);
  const uint64_t bytes =
      (uint64_t)refit_dw_get32(frame + 8) | (uint64_t)refit_dw_get32(frame + 12) << 32;
  if (count != (uint64_t)n || bytes != len)
    return REFIT_ERR(REFIT_ERR_INTEGRITY,
                     "%s: delta frame of %u chunks and %llu bytes, expected %lld "
                     "chunks and %zu bytes (the received length)",
                     what, count, (unsigned long long)bytes, (long long)n, len);
  size_t at = REFIT_DW_HEADER_BYTES;
  for (int64_t i = 0; i < n; i++) {
    if (len - at < 4)
      return REFIT_ERR(REFIT_ERR_INTEGRITY,
                       "%s: delta frame ends before chunk %lld of %lld", what,
                       (long long)i, (long long)n);
    const size_t dlen = refit_dw_get32(frame + at);
    at += 4;
    if (dlen > len - at)
      return REFIT_ERR(REFIT_ERR_INTEGRITY,
                       "%s: chunk %lld's delta of %zu bytes runs past the frame "
                       "(%zu bytes left)",
                       what, (long long)i, dlen, len - at);
    REFIT_CHECK(fn(ctx, i, frame + at, dlen));
    at += dlen;
  }
  if (at != len)
    return REFIT_ERR(REFIT_ERR_INTEGRITY,
                     "%s: delta frame has %zu bytes after its last chunk", what,
                     len - at);
  return REFIT_OK;
}

/* Message m's chunk spans into dw->span (m->chunk_count + 1 offsets). */
static void refit_dw_spans(const refit_plan_t *p, const refit_msg_t *m, int64_t *span) {
  for (int64_t i = 0; i < m->chunk_count; i++)
    span[i] = p->chunks[m->chunk_begin + i].offset - m->offset;
  span[m->chunk_count] = m->bytes;
}

/* Why this session cannot carry delta refits, or NULL. */
static const char *refit_dw_unusable(const refit_session_t *s) {
  if (!s->transport.ops->variable_length)
    return "its transport sends messages of a fixed length only";
  if (refit_mem_on_device(s->mem))
    return "its buffers are in device memory";
  if (s->zero_copy)
    return "zero copy moves no weight bytes";
  /* The config quantizes on the trainer under delta (prequantize), so this
   * is a guard: a generator applies deltas in place only. */
  if (!s->is_trainer && !s->loader->in_place)
    return "its chunks do not all land bytewise (BF16 rows quantized on the generator)";
  return NULL;
}

refit_status_t refit_dw_create(refit_session_t *s, refit_dw_t **out) {
  const refit_plan_t *p = s->plan;
  *out = NULL;
  if (s->cfg.refit.delta == REFIT_DELTA_MODE_OFF)
    return REFIT_OK;
  const char *why = refit_dw_unusable(s);
  if (why != NULL && s->cfg.refit.delta == REFIT_DELTA_MODE_ON)
    return REFIT_ERR(REFIT_ERR_CONFIG,
                     "refit.delta: on: %s rank %d cannot carry delta refits: %s "
                     "(transport %s); use transport mpi or ucx with host memory "
                     "and zero_copy: off, or delta: auto for full refits here",
                     s->is_trainer ? "trainer" : "generator", s->role_rank, why,
                     s->transport.ops->name);
  refit_dw_t *dw = calloc(1, sizeof(*dw));
  if (dw == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "delta refit state");
  dw->mode = s->cfg.refit.delta;
  dw->usable = why == NULL;
  *out = dw;
  if (!dw->usable) {
    REFIT_INFO("%s rank %d: refit.delta: auto: full refits only (%s)",
               s->is_trainer ? "trainer" : "generator", s->role_rank, why);
    return REFIT_OK;
  }
  int64_t max_chunks = 1, bucket_frames = 0;
  for (int32_t b = 0; b < p->nbuckets; b++) {
    int64_t frames = 0;
    if (s->my_begin[b + 1] - s->my_begin[b] > dw->max_msgs)
      dw->max_msgs = s->my_begin[b + 1] - s->my_begin[b];
    for (int64_t k = s->my_begin[b]; k < s->my_begin[b + 1]; k++) {
      const refit_msg_t *m = &p->msgs[s->my_msgs[k]];
      if (m->chunk_count > max_chunks)
        max_chunks = m->chunk_count;
      frames += (int64_t)refit_dw_frame_bound(m->bytes, m->chunk_count);
    }
    if (frames > bucket_frames)
      bucket_frames = frames;
  }
  dw->span = malloc((size_t)(max_chunks + 1) * sizeof(*dw->span));
  /* Bucket b's area of a trainer's baseline, in the send buffer's layout
   * (messages packed once for several generators kept once). A generator
   * keeps none: it applies deltas in place (loader_delta.c). */
  dw->base_off = calloc((size_t)p->nbuckets + 1, sizeof(int64_t));
  for (int32_t b = 0; s->is_trainer && dw->base_off != NULL && b < p->nbuckets; b++) {
    int64_t used = 0;
    for (int64_t k = s->my_begin[b]; k < s->my_begin[b + 1]; k++) {
      const int64_t end = s->msg_wire[k] + p->msgs[s->my_msgs[k]].bytes;
      used = end > used ? end : used;
    }
    dw->base_off[b + 1] = dw->base_off[b] + used;
  }
  dw->base_bytes = dw->base_off ? (size_t)dw->base_off[p->nbuckets] : 0;
  if (s->is_trainer) {
    dw->enc_bytes = (size_t)bucket_frames;
    for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++)
      dw->enc[i] = malloc(dw->enc_bytes ? dw->enc_bytes : 1);
  } else {
    for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++)
      dw->got[i] = calloc((size_t)(dw->max_msgs ? dw->max_msgs : 1), sizeof(size_t));
  }
  /* A trainer packs into a candidate beside the baseline (two copies, the
   * roles swapped at commit). */
  dw->copies = s->is_trainer ? 2 : 0;
  dw->base = malloc(dw->base_bytes ? (size_t)dw->copies * dw->base_bytes : 1);
  int ok = dw->span != NULL && dw->base_off != NULL && dw->base != NULL;
  for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++)
    ok = ok && (s->is_trainer ? dw->enc[i] != NULL : dw->got[i] != NULL);
  if (!ok) {
    const size_t bytes = dw->copies * dw->base_bytes;
    refit_dw_destroy(dw);
    *out = NULL;
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "delta refit baseline of %zu bytes on %s rank %d",
                     bytes, s->is_trainer ? "trainer" : "generator", s->role_rank);
  }
  if (!s->is_trainer) {
    REFIT_INFO("generator rank %d: refit.delta %s: deltas applied in place in runtime "
               "storage (no baseline; digests of %lld chunks, %.1f KiB)",
               s->role_rank, dw->mode == REFIT_DELTA_MODE_ON ? "on" : "auto",
               (long long)s->loader->nsums, (double)(16 * s->loader->nsums) / 1024.0);
    return REFIT_OK;
  }
  REFIT_INFO("trainer rank %d: refit.delta %s: baseline of the last committed version "
             "%.1f MiB in host memory and a candidate as large, frame buffers 2 x "
             "%.1f MiB",
             s->role_rank, dw->mode == REFIT_DELTA_MODE_ON ? "on" : "auto",
             (double)dw->base_bytes / 1048576.0, (double)dw->enc_bytes / 1048576.0);
  return REFIT_OK;
}

void refit_dw_destroy(refit_dw_t *dw) {
  if (dw == NULL)
    return;
  free(dw->base);
  free(dw->base_off);
  free(dw->span);
  for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++) {
    free(dw->enc[i]);
    free(dw->got[i]);
  }
  free(dw);
}

int refit_dw_ready(const refit_session_t *s, const refit_dw_t *dw) {
  const int pays = dw == NULL || dw->mode != REFIT_DELTA_MODE_AUTO ||
                   dw->last_fraction <= REFIT_DW_AUTO_BREAK_EVEN ||
                   dw->full_streak >= REFIT_DW_AUTO_PROBE;
  return dw != NULL && dw->usable && dw->valid && dw->version == s->committed &&
         s->committed > 0 && s->state != REFIT_STATE_POISONED && pays;
}

void refit_dw_begin(refit_dw_t *dw, int delta_refit) {
  if (dw == NULL)
    return;
  dw->this_refit = delta_refit && dw->usable;
  /* A generator's runtime storage and chunk digests are rewritten from now
   * on; the trainer's baseline stays as it is (the refit packs into the
   * candidate). */
  dw->valid = dw->copies == 2 && dw->valid;
  dw->wire_bytes = dw->full_bytes = 0;
  dw->framed_msgs = 0;
}

void refit_dw_commit(refit_dw_t *dw, uint64_t version) {
  if (dw == NULL || !dw->usable)
    return;
  dw->valid = 1;
  dw->version = version;
  if (dw->this_refit) {
    dw->last_fraction =
        dw->full_bytes > 0 ? (double)dw->wire_bytes / (double)dw->full_bytes : 0.0;
    dw->full_streak = 0;
  } else {
    dw->full_streak++;
  }
  if (dw->copies == 2)
    dw->cur = 1 - dw->cur;
}

unsigned char *refit_dw_pack_target(refit_dw_t *dw, int32_t b, unsigned char *buf) {
  if (dw == NULL || !dw->usable)
    return buf;
  return dw->base + (size_t)(1 - dw->cur) * dw->base_bytes + dw->base_off[b];
}

refit_status_t refit_dw_trainer_encode(refit_session_t *s, int32_t b, int slot,
                                       unsigned char *buf, refit_xfer_t *xfers, int nx) {
  refit_dw_t *dw = s->dw;
  const refit_plan_t *p = s->plan;
  size_t at = 0;
  if (nx != s->my_begin[b + 1] - s->my_begin[b])
    return REFIT_ERR(REFIT_ERR_INTERNAL,
                     "delta refit: bucket %d lists %d sends for %lld messages", b, nx,
                     (long long)(s->my_begin[b + 1] - s->my_begin[b]));
  for (int i = 0; i < nx; i++) {
    const int64_t k = s->my_begin[b] + i;
    const refit_msg_t *m = &p->msgs[s->my_msgs[k]];
    dw->full_bytes += (uint64_t)m->bytes;
    int first = i; /* the first send of these bytes in this bucket */
    for (int j = 0; j < i && first == i; j++)
      if (s->msg_wire[s->my_begin[b] + j] == s->msg_wire[k])
        first = j;
    if (first != i) {
      xfers[i].buf = xfers[first].buf;
      xfers[i].bytes = xfers[first].bytes;
    } else if (dw->usable) {
      const unsigned char *now = buf + s->msg_wire[k];
      const unsigned char *base =
          dw->base + (size_t)dw->cur * dw->base_bytes + dw->base_off[b] + s->msg_wire[k];
      if (dw->this_refit) {
        size_t len = 0;
        refit_dw_spans(p, m, dw->span);
        REFIT_CHECK(refit_dw_frame_encode(now, base, dw->span, m->chunk_count,
                                          dw->enc[slot] + at, &len));
        if (len < (size_t)m->bytes) {
          xfers[i].buf = dw->enc[slot] + at;
          xfers[i].bytes = len;
          at += len;
        }
      }
    }
    dw->framed_msgs += xfers[i].bytes < (size_t)m->bytes;
    dw->wire_bytes += xfers[i].bytes;
  }
  return REFIT_OK;
}

void refit_dw_generator_recvs(refit_session_t *s, int slot, refit_xfer_t *xfers,
                              int nx) {
  refit_dw_t *dw = s->dw;
  for (int i = 0; i < nx; i++) {
    xfers[i].got = NULL;
    if (dw == NULL || !dw->usable)
      continue;
    if (dw->this_refit) { /* a frame or the full message, into staging */
      dw->got[slot][i] = 0;
      xfers[i].got = &dw->got[slot][i];
    }
  }
}

/* A message's chunks applied in place; `first` is how many times its chunk
 * 0 is (1; the land fault seam's drop 0, duplicate 2). */
typedef struct {
  refit_session_t *s;
  const refit_msg_t *m;
  uint64_t tag;
  const char *what;
  int full, first;
} refit_dw_place_t;

static refit_status_t refit_dw_place_chunk(void *ctx, int64_t i, const unsigned char *delta,
                                           size_t len) {
  const refit_dw_place_t *c = ctx;
  for (int t = 0; t < (i == 0 ? c->first : 1); t++)
    REFIT_CHECK(refit_loader_delta_chunk(c->s->loader, c->m->chunk_begin + i, delta, len,
                                         c->full, c->tag, c->what, i, c->m->chunk_count));
  return REFIT_OK;
}

/* A delta refit's bucket b on a generator that applies in place: every
 * frame chunk by chunk, and every message that came whole as well (its
 * chunks compared with runtime storage, only the changed bytes written). */
static refit_status_t refit_dw_generator_in_place(refit_session_t *s, int32_t b, int slot,
                                                  unsigned char *staging,
                                                  refit_land_fault_t fault) {
  refit_dw_t *dw = s->dw;
  const refit_plan_t *p = s->plan;
  const uint64_t tag = refit_seal_tag(s->pending, s->attempt);
  /* The land fault seam, as refit_loader_land_bucket plays it: a flipped
   * bit in the bucket's first message as received, or its first chunk
   * dropped or applied twice. */
  if (fault == REFIT_LAND_FLIP_ONE && s->my_begin[b] < s->my_begin[b + 1] && dw->got[slot][0] > 0)
    staging[p->msgs[s->my_msgs[s->my_begin[b]]].offset + dw->got[slot][0] / 2] ^= 0x10;
  for (int64_t k = s->my_begin[b]; k < s->my_begin[b + 1]; k++) {
    const refit_msg_t *m = &p->msgs[s->my_msgs[k]];
    const size_t got = dw->got[slot][k - s->my_begin[b]];
    const unsigned char *msg = staging + m->offset;
    char what[160];
    snprintf(what, sizeof(what),
             "version %llu bucket %d: message from trainer rank %d to generator rank %d",
             (unsigned long long)s->pending, b, m->src_rank, m->dst_rank);
    dw->full_bytes += (uint64_t)m->bytes;
    dw->wire_bytes += got;
    refit_dw_spans(p, m, dw->span);
    const int first = k > s->my_begin[b]               ? 1
                      : fault == REFIT_LAND_DROP_ONE      ? 0
                      : fault == REFIT_LAND_DUPLICATE_ONE ? 2
                                                          : 1;
    refit_dw_place_t c = {s, m, tag, what, got == (size_t)m->bytes, first};
    if (c.full) {
      for (int64_t i = 0; i < m->chunk_count; i++)
        REFIT_CHECK(refit_dw_place_chunk(&c, i, msg + dw->span[i],
                                         (size_t)(dw->span[i + 1] - dw->span[i])));
      continue;
    }
    REFIT_CHECK(refit_dw_frame_walk(msg, got, dw->span, m->chunk_count, what,
                                    refit_dw_place_chunk, &c));
    dw->framed_msgs++;
  }
  return REFIT_OK;
}

refit_status_t refit_dw_generator_apply(refit_session_t *s, int32_t b, int slot,
                                        unsigned char *staging, refit_land_fault_t fault,
                                        unsigned char **land_from) {
  refit_dw_t *dw = s->dw;
  const refit_plan_t *p = s->plan;
  *land_from = staging;
  if (dw == NULL || !dw->usable)
    return REFIT_OK;
  if (dw->this_refit) {
    *land_from = NULL; /* applied in place: nothing left to land */
    return refit_dw_generator_in_place(s, b, slot, staging, fault);
  }
  for (int64_t k = s->my_begin[b]; k < s->my_begin[b + 1]; k++)
    dw->full_bytes += (uint64_t)p->msgs[s->my_msgs[k]].bytes;
  dw->wire_bytes = dw->full_bytes;
  return REFIT_OK;
}

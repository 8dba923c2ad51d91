/*
 * Delta refits on the wire: baselines, frames and the decision's local half
 * (delta_wire.h says what and why).
 */
#include "session/delta_wire.h"
#include "session/session.h"

#include "core/digest.h"
#include "core/error.h"
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

/* Why this session cannot carry delta refits, or NULL; `buf` (len bytes)
 * holds a reason said with a tensor's name. */
static const char *refit_dw_unusable(const refit_session_t *s, char *buf, size_t len) {
  if (!s->transport.ops->variable_length)
    return "its transport sends messages of a fixed length only (delta: on sends "
           "their lengths ahead over MPI, not yet measured against full refits)";
  if (s->zero_copy)
    return "zero copy moves no weight bytes";
  /* Block FP8 tensors whose trainer shards split a block travel BF16 and
   * are quantized on the generator (plan.h): every rank sees it in the plan,
   * so all say so (delta: on refuses such a plan, refit_config_plan_check). */
  if (refit_config_block_fallback(s->cat, s->plan, buf, len))
    return buf;
  /* The config quantizes on the trainer under delta (prequantize), so this
   * is a guard: a generator applies deltas in place only. */
  if (!s->is_trainer && !s->loader->in_place)
    return "its chunks do not all land bytewise (BF16 rows quantized on the generator)";
  return NULL;
}

/* Why delta: auto runs full refits on a session that could carry delta
 * ones, or NULL. On GPUs over ipc (one node) a full refit moves its bytes
 * at HBM speed already, and a delta one adds the trainer's encode (a pass
 * reading the new bytes and the baseline) to what it saves: measured no
 * faster at 0.5 % of the bytes on the wire and slower above
 * (docs/benchmarks.md, "Delta refit on one H200"). */
static const char *refit_dw_unpaying(const refit_session_t *s) {
  if (refit_mem_on_device(s->mem) && s->transport.ops->kind == REFIT_TRANSPORT_IPC)
    return "on GPUs over ipc a delta refit measured no faster than a full one; "
           "delta: on forces them";
  return NULL;
}

/* Room for the baseline areas and buffers of refit_dw_t, sized from the
 * plan: per bucket, this rank's messages (a trainer: in its send buffer's
 * layout, messages packed once for several generators kept once; a
 * generator: in its staging layout). */
static refit_status_t refit_dw_size(refit_session_t *s, refit_dw_t *dw, size_t *frames) {
  const refit_plan_t *p = s->plan;
  int64_t max_chunks = 1, bucket_frames = 0, bucket_chunks = 0, bucket_scratch = 0,
          bucket_hdr = 0, bucket_bytes = 0;
  dw->base_off = calloc((size_t)p->nbuckets + 1, sizeof(int64_t));
  if (dw->base_off == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "delta refit tables of %d buckets", p->nbuckets);
  for (int32_t b = 0; b < p->nbuckets; b++) {
    int64_t frames = 0, chunks = 0, scratch = 0, hdr = 0, used = 0, bytes = 0;
    if (s->my_begin[b + 1] - s->my_begin[b] > dw->max_msgs)
      dw->max_msgs = s->my_begin[b + 1] - s->my_begin[b];
    for (int64_t k = s->my_begin[b]; k < s->my_begin[b + 1]; k++) {
      const refit_msg_t *m = &p->msgs[s->my_msgs[k]];
      max_chunks = m->chunk_count > max_chunks ? m->chunk_count : max_chunks;
      bytes += m->bytes;
      frames += (int64_t)refit_dw_frame_bound(m->bytes, m->chunk_count);
      chunks += m->chunk_count;
      scratch += m->bytes + m->chunk_count * (REFIT_DELTA_HEADER_BYTES + 16);
      hdr += REFIT_DW_HEADER_BYTES + 4 * m->chunk_count;
      const int64_t end =
          (s->is_trainer ? s->msg_wire[k] : m->offset) + m->bytes;
      used = end > used ? end : used;
    }
    bucket_frames = frames > bucket_frames ? frames : bucket_frames;
    bucket_chunks = chunks > bucket_chunks ? chunks : bucket_chunks;
    bucket_scratch = scratch > bucket_scratch ? scratch : bucket_scratch;
    bucket_hdr = hdr > bucket_hdr ? hdr : bucket_hdr;
    bucket_bytes = bytes > bucket_bytes ? bytes : bucket_bytes;
    dw->base_off[b + 1] = dw->base_off[b] + used;
  }
  dw->span = malloc((size_t)(max_chunks + 1) * sizeof(*dw->span));
  dw->base_bytes = (size_t)dw->base_off[p->nbuckets];
  dw->max_chunks = bucket_chunks;
  dw->hdr_off = (size_t)bucket_scratch;
  dw->hdr_bytes = (size_t)bucket_hdr;
  dw->scratch_bytes = dw->hdr_off + dw->hdr_bytes;
  dw->hframe_bytes = (size_t)bucket_bytes;
  *frames = (size_t)bucket_frames;
  return dw->span != NULL ? REFIT_OK
                          : REFIT_ERR(REFIT_ERR_NO_MEMORY, "delta refit spans");
}

/* Memory of the kind the baseline lives in: device memory, pinned host
 * memory or plain host memory. */
static refit_status_t refit_dw_alloc(refit_dw_t *dw, int pinned, size_t bytes, void **ptr) {
  if (!dw->device) {
    *ptr = malloc(bytes ? bytes : 1);
    return *ptr != NULL ? REFIT_OK
                        : REFIT_ERR(REFIT_ERR_NO_MEMORY, "%zu bytes of host memory", bytes);
  }
  return pinned ? refit_mem_alloc_pinned(dw->mem, bytes, ptr)
                : refit_mem_alloc(dw->mem, bytes, ptr);
}

static void refit_dw_free(refit_dw_t *dw, int pinned, void *ptr) {
  if (ptr == NULL)
    return;
  if (!dw->device)
    free(ptr);
  else if (pinned)
    refit_mem_free_pinned(dw->mem, ptr);
  else
    refit_mem_free(dw->mem, ptr);
}

static refit_status_t refit_dw_buffers(refit_session_t *s, refit_dw_t *dw) {
  size_t frames = 0;
  REFIT_CHECK(refit_dw_size(s, dw, &frames));
  /* A trainer keeps one copy, rewritten in place by every refit (see
   * refit_dw_pack_target); a generator keeps none. */
  if (s->is_trainer) {
    REFIT_CHECK(refit_dw_alloc(dw, dw->pinned, dw->base_bytes, (void **)&dw->base));
    dw->enc_bytes = frames;
    for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++)
      REFIT_CHECK(refit_dw_alloc(dw, 0, dw->enc_bytes, (void **)&dw->enc[i]));
  } else {
    for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++)
      if ((dw->got[i] = calloc((size_t)(dw->max_msgs ? dw->max_msgs : 1),
                               sizeof(size_t))) == NULL)
        return REFIT_ERR(REFIT_ERR_NO_MEMORY, "delta refit lengths");
  }
  if (!dw->device)
    return REFIT_OK;
  const size_t n = (size_t)(dw->max_chunks ? dw->max_chunks : 1);
  if (s->is_trainer) {
    dw->chunks = malloc(n * sizeof(*dw->chunks));
    dw->lens = malloc(n * sizeof(*dw->lens));
    dw->pieces = malloc((2 * n + (size_t)dw->max_msgs + 1) * sizeof(*dw->pieces));
    dw->hdr = malloc(dw->hdr_bytes ? dw->hdr_bytes : 1);
    if (dw->chunks == NULL || dw->lens == NULL || dw->pieces == NULL || dw->hdr == NULL)
      return REFIT_ERR(REFIT_ERR_NO_MEMORY, "delta frame tables of %zu chunks", n);
    return refit_mem_alloc(dw->mem, dw->scratch_bytes, (void **)&dw->scratch);
  }
  /* A generator: the host copies of a bucket's frames, and a batch entry
   * per chunk (one more: the land fault seam's duplicate). */
  dw->batch = malloc((n + 1) * sizeof(*dw->batch));
  dw->chunk_at = malloc((n + 1) * sizeof(*dw->chunk_at));
  if (dw->batch == NULL || dw->chunk_at == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "delta batch of %zu chunks", n + 1);
  /* Pinned: the frames are read back every delta refit. */
  return refit_mem_alloc_pinned(dw->mem, dw->hframe_bytes ? dw->hframe_bytes : 1,
                                (void **)&dw->hframe);
}

refit_status_t refit_dw_create(refit_session_t *s, refit_dw_t **out) {
  *out = NULL;
  if (s->cfg.refit.delta == REFIT_DELTA_MODE_OFF)
    return REFIT_OK;
  char reason[1024];
  const char *why = refit_dw_unusable(s, reason, sizeof(reason));
  if (why == NULL && s->cfg.refit.delta == REFIT_DELTA_MODE_AUTO)
    why = refit_dw_unpaying(s);
  if (why != NULL && s->cfg.refit.delta == REFIT_DELTA_MODE_ON)
    return REFIT_ERR(REFIT_ERR_CONFIG,
                     "refit.delta: on: %s rank %d cannot carry delta refits: %s "
                     "(transport %s); use transport ipc (device memory, one node), "
                     "ucx or mpi, and zero_copy: off, or delta: auto for full "
                     "refits here",
                     s->is_trainer ? "trainer" : "generator", s->role_rank, why,
                     s->transport.ops->name);
  refit_dw_t *dw = calloc(1, sizeof(*dw));
  if (dw == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "delta refit state");
  dw->mode = s->cfg.refit.delta;
  dw->full_every = s->cfg.refit.delta_full_every;
  dw->usable = why == NULL;
  if (!dw->usable && !s->is_trainer)
    s->loader->in_place = 0; /* no digests to keep */
  dw->mem = s->mem;
  dw->device = refit_mem_on_device(s->mem);
  dw->pinned = dw->device && s->is_trainer &&
               s->cfg.refit.delta_baseline == REFIT_DELTA_BASELINE_HOST;
  *out = dw;
  if (!dw->usable) {
    REFIT_INFO("%s rank %d: refit.delta: auto: full refits only (%s)",
               s->is_trainer ? "trainer" : "generator", s->role_rank, why);
    return REFIT_OK;
  }
  refit_status_t st = refit_dw_buffers(s, dw);
  if (st != REFIT_OK) {
    char why_not[512];
    snprintf(why_not, sizeof(why_not), "%s", refit_last_error());
    const size_t bytes = s->is_trainer ? dw->base_bytes : 0;
    refit_dw_destroy(dw);
    *out = NULL;
    return REFIT_ERR(st, "delta refit baseline of %zu bytes on %s rank %d: %s", bytes,
                     s->is_trainer ? "trainer" : "generator", s->role_rank, why_not);
  }
  const char *mode = dw->mode == REFIT_DELTA_MODE_ON ? "on" : "auto";
  if (!s->is_trainer) {
    char extra[160] = "";
    if (dw->device)
      snprintf(extra, sizeof(extra),
               ", %.1f MiB of pinned host memory for a bucket's frames, an undo log in "
               "GPU memory of 9 bytes per changed byte under restore: full",
               (double)dw->hframe_bytes / 1048576.0);
    REFIT_INFO("generator rank %d: refit.delta %s: deltas applied in place in runtime "
               "storage%s (no baseline; digests of %lld chunks, %.1f KiB%s)",
               s->role_rank, mode, dw->device ? " on the GPU" : "",
               (long long)s->loader->nsums, (double)(16 * s->loader->nsums) / 1024.0, extra);
    return REFIT_OK;
  }
  REFIT_INFO("trainer rank %d: refit.delta %s: baseline of the last committed version "
             "%.1f MiB in %s memory (rewritten in place by each refit), frame buffers "
             "2 x %.1f MiB%s",
             s->role_rank, mode, (double)dw->base_bytes / 1048576.0,
             !dw->device ? "host" : dw->pinned ? "pinned host" : "GPU",
             (double)dw->enc_bytes / 1048576.0,
             dw->device ? ", delta scratch in GPU memory" : "");
  return REFIT_OK;
}

void refit_dw_destroy(refit_dw_t *dw) {
  if (dw == NULL)
    return;
  if (dw->device)
    (void)refit_mem_sync(dw->mem);
  refit_dw_free(dw, dw->pinned, dw->base);
  refit_dw_free(dw, 0, dw->scratch);
  free(dw->base_off);
  free(dw->span);
  for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++) {
    refit_dw_free(dw, 0, dw->enc[i]);
    free(dw->got[i]);
  }
  free(dw->chunks);
  free(dw->batch);
  free(dw->lens);
  free(dw->pieces);
  free(dw->hdr);
  if (dw->hframe != NULL)
    refit_mem_free_pinned(dw->mem, dw->hframe);
  free(dw->chunk_at);
  free(dw);
}

int refit_dw_ready(const refit_session_t *s, const refit_dw_t *dw) {
  if (dw == NULL)
    return 0;
  const int pays = dw->mode != REFIT_DELTA_MODE_AUTO ||
                   dw->last_fraction <= REFIT_DW_AUTO_BREAK_EVEN ||
                   dw->full_streak >= REFIT_DW_AUTO_PROBE;
  /* refit.delta_full_every: every rank counts the same commits, so all say
   * no at the same refit. */
  const int full_due = dw->full_every > 0 && dw->delta_streak >= dw->full_every - 1;
  return dw->usable && dw->valid && dw->version == s->committed && s->committed > 0 &&
         s->state != REFIT_STATE_POISONED && pays && !full_due;
}

void refit_dw_begin(refit_dw_t *dw, int delta_refit) {
  if (dw == NULL)
    return;
  dw->this_refit = delta_refit && dw->usable;
  /* Every baseline is rewritten from now on: a generator's runtime storage
   * and chunk digests, a trainer's bytes bucket by bucket. */
  dw->valid = 0;
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
    dw->delta_streak++;
  } else {
    dw->full_streak++;
    dw->delta_streak = 0;
  }
}

/* One copy is enough because a baseline is needed only after a commit: a
 * refit that does not commit leaves every generator without one, so the
 * next refit is full whatever the trainer holds. A full refit packs straight
 * into the baseline and sends from it; a delta refit packs into the send
 * buffer, encodes against the baseline, and then brings the baseline's
 * bytes up to the new ones with the deltas it made (refit_dw_encode_host,
 * refit_dw_encode_device). */
unsigned char *refit_dw_pack_target(refit_dw_t *dw, int32_t b, unsigned char *buf) {
  if (dw == NULL || !dw->usable || dw->this_refit)
    return buf;
  return dw->base + dw->base_off[b];
}

/* The first send of bucket b listing the same bytes as send i (i itself
 * unless a message packed once goes to several generators). */
static int refit_dw_first_send(const refit_session_t *s, int32_t b, int i) {
  const int64_t k = s->my_begin[b] + i;
  for (int j = 0; j < i; j++)
    if (s->msg_wire[s->my_begin[b] + j] == s->msg_wire[k])
      return j;
  return i;
}

static unsigned char *refit_dw_baseline(const refit_dw_t *dw, int32_t b) {
  return dw->base + dw->base_off[b];
}

typedef struct {
  unsigned char *dst;
  const int64_t *span;
  int64_t n;
  const char *what;
} refit_dw_decode_t;

static refit_status_t refit_dw_decode_chunk(void *ctx, int64_t i, const unsigned char *delta,
                                            size_t len) {
  const refit_dw_decode_t *d = ctx;
  refit_status_t st = refit_delta_decode(delta, len, d->dst + d->span[i],
                                         (size_t)(d->span[i + 1] - d->span[i]));
  if (st != REFIT_OK) {
    char why[512];
    snprintf(why, sizeof(why), "%s", refit_last_error());
    return REFIT_ERR(st, "%s, chunk %lld of %lld: %s", d->what, (long long)i,
                     (long long)d->n, why);
  }
  return REFIT_OK;
}

refit_status_t refit_dw_frame_apply(const unsigned char *frame, size_t len,
                                    unsigned char *dst, const int64_t *span, int64_t n,
                                    const char *what) {
  refit_dw_decode_t d = {dst, span, n, what};
  return refit_dw_frame_walk(frame, len, span, n, what, refit_dw_decode_chunk, &d);
}

/* Host memory: each message's frame encoded straight into the slot's frame
 * buffer. */
static refit_status_t refit_dw_encode_host(refit_session_t *s, int32_t b, int slot,
                                           unsigned char *buf, refit_xfer_t *xfers, int nx) {
  refit_dw_t *dw = s->dw;
  size_t at = 0;
  for (int i = 0; i < nx; i++) {
    const int64_t k = s->my_begin[b] + i;
    const refit_msg_t *m = &s->plan->msgs[s->my_msgs[k]];
    if (refit_dw_first_send(s, b, i) != i)
      continue;
    size_t len = 0;
    unsigned char *base = refit_dw_baseline(dw, b) + s->msg_wire[k];
    refit_dw_spans(s->plan, m, dw->span);
    REFIT_CHECK(refit_dw_frame_encode(buf + s->msg_wire[k], base, dw->span, m->chunk_count,
                                      dw->enc[slot] + at, &len));
    /* The baseline becomes the new bytes through the frame just made: it
     * writes only what changed (a dense chunk whole), and applying it checks
     * it against the bytes it was made from. */
    REFIT_CHECK(refit_dw_frame_apply(dw->enc[slot] + at, len, base, dw->span,
                                     m->chunk_count, "delta refit: trainer baseline"));
    if (len < (size_t)m->bytes) {
      xfers[i].buf = dw->enc[slot] + at;
      xfers[i].bytes = len;
      at += len;
    }
  }
  return REFIT_OK;
}

/* Device memory: every chunk of the bucket's messages encoded in one call
 * of the codec's CUDA twin into the scratch (chunk j's delta at a fixed
 * offset), the lengths read back, and each message that is shorter as a
 * frame put together from its header, the lengths and the deltas in one
 * gather pass into the slot's frame buffer. Waits for it (sends must be
 * complete when the transport starts). */
static refit_status_t refit_dw_encode_device(refit_session_t *s, int32_t b, int slot,
                                             unsigned char *buf, refit_xfer_t *xfers,
                                             int nx) {
  refit_dw_t *dw = s->dw;
  const refit_plan_t *p = s->plan;
  int64_t n = 0;
  uint64_t off = 0;
  for (int i = 0; i < nx; i++) {
    const int64_t k = s->my_begin[b] + i;
    const refit_msg_t *m = &p->msgs[s->my_msgs[k]];
    if (refit_dw_first_send(s, b, i) != i)
      continue;
    refit_dw_spans(p, m, dw->span);
    for (int64_t j = 0; j < m->chunk_count; j++, n++) {
      const uint64_t bytes = (uint64_t)(dw->span[j + 1] - dw->span[j]);
      dw->chunks[n] = (refit_mem_delta_t){
          .now = buf + s->msg_wire[k] + dw->span[j],
          .base = (void *)(refit_dw_baseline(dw, b) + s->msg_wire[k] + dw->span[j]),
          .bytes = bytes,
          .off = off};
      off += (refit_delta_bound(bytes) + 15) & ~UINT64_C(15);
    }
  }
  if (n > dw->max_chunks || off > dw->hdr_off)
    return REFIT_ERR(REFIT_ERR_INTERNAL,
                     "delta refit: bucket %d has %lld chunks and %llu scratch bytes, "
                     "sized for %lld and %zu",
                     b, (long long)n, (unsigned long long)off, (long long)dw->max_chunks,
                     dw->hdr_off);
  REFIT_CHECK(refit_mem_delta_encode(dw->mem, dw->chunks, n, dw->scratch, dw->lens));

  int64_t c = 0, np = 0;
  size_t at = 0, h = 0;
  for (int i = 0; i < nx; i++) {
    const int64_t k = s->my_begin[b] + i;
    const refit_msg_t *m = &p->msgs[s->my_msgs[k]];
    if (refit_dw_first_send(s, b, i) != i)
      continue;
    uint64_t len = REFIT_DW_HEADER_BYTES;
    for (int64_t j = 0; j < m->chunk_count; j++)
      len += 4 + dw->lens[c + j];
    if (len >= (uint64_t)m->bytes) {
      c += m->chunk_count;
      continue;
    }
    unsigned char *frame = dw->enc[slot] + at;
    unsigned char *hd = dw->hdr + h;
    refit_dw_put32(hd, REFIT_DW_MAGIC);
    refit_dw_put32(hd + 4, (uint32_t)m->chunk_count);
    refit_dw_put32(hd + 8, (uint32_t)len);
    refit_dw_put32(hd + 12, (uint32_t)(len >> 32));
    dw->pieces[np++] = (refit_mem_piece_t){(int64_t)(dw->hdr_off + h), frame,
                                           REFIT_DW_HEADER_BYTES};
    h += REFIT_DW_HEADER_BYTES;
    size_t f = REFIT_DW_HEADER_BYTES;
    for (int64_t j = 0; j < m->chunk_count; j++, c++) {
      refit_dw_put32(dw->hdr + h, (uint32_t)dw->lens[c]);
      dw->pieces[np++] = (refit_mem_piece_t){(int64_t)(dw->hdr_off + h), frame + f, 4};
      h += 4;
      f += 4;
      dw->pieces[np++] = (refit_mem_piece_t){(int64_t)dw->chunks[c].off, frame + f,
                                             (int64_t)dw->lens[c]};
      f += dw->lens[c];
    }
    xfers[i].buf = frame;
    xfers[i].bytes = (size_t)len;
    at += (size_t)len;
  }
  if (np > 0) {
    REFIT_CHECK(refit_mem_copy(dw->mem, dw->scratch + dw->hdr_off, dw->hdr, h));
    REFIT_CHECK(refit_mem_gather(dw->mem, dw->scratch, dw->pieces, np));
  }
  /* The baseline becomes the new bytes through the deltas just made, sent
   * or not (every chunk has one in the scratch): only what changed is
   * written, a dense chunk whole, each checked against the bytes it was
   * made from. Queued after the frames' gather, which reads the same
   * deltas, so that the check's read-back is the bucket's one wait after
   * the lengths' (the sends need the frames complete). */
  return refit_mem_delta_apply(dw->mem, dw->chunks, n, dw->scratch, dw->lens);
}

refit_status_t refit_dw_trainer_encode(refit_session_t *s, int32_t b, int slot,
                                       unsigned char *buf, refit_xfer_t *xfers, int nx) {
  refit_dw_t *dw = s->dw;
  const refit_plan_t *p = s->plan;
  if (nx != s->my_begin[b + 1] - s->my_begin[b])
    return REFIT_ERR(REFIT_ERR_INTERNAL,
                     "delta refit: bucket %d lists %d sends for %lld messages", b, nx,
                     (long long)(s->my_begin[b + 1] - s->my_begin[b]));
  if (dw->usable && dw->this_refit)
    REFIT_CHECK(dw->device ? refit_dw_encode_device(s, b, slot, buf, xfers, nx)
                           : refit_dw_encode_host(s, b, slot, buf, xfers, nx));
  for (int i = 0; i < nx; i++) {
    const refit_msg_t *m = &p->msgs[s->my_msgs[s->my_begin[b] + i]];
    const int first = refit_dw_first_send(s, b, i);
    if (first != i) {
      xfers[i].buf = xfers[first].buf;
      xfers[i].bytes = xfers[first].bytes;
    }
    dw->full_bytes += (uint64_t)m->bytes;
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

/* The land fault seam in a delta refit's bucket b, as refit_loader_land_bucket
 * plays it on a full one's: a flipped bit in the bucket's first message as
 * received (host or device memory alike), or its first chunk dropped or
 * applied twice: refit_dw_first_times gives how many times message k's
 * chunk 0 is applied. */
static refit_status_t refit_dw_flip(refit_session_t *s, int32_t b, int slot,
                                    unsigned char *staging, refit_land_fault_t fault) {
  fault = refit_land_fault(fault);
  const size_t got = s->dw->got[slot][0];
  if (fault != REFIT_LAND_FLIP_ONE || s->my_begin[b] == s->my_begin[b + 1] || got == 0)
    return REFIT_OK;
  unsigned char byte, *at = staging + s->plan->msgs[s->my_msgs[s->my_begin[b]]].offset + got / 2;
  REFIT_CHECK(refit_mem_to_host(s->mem, &byte, at, 1));
  byte ^= 0x10;
  return refit_mem_from_host(s->mem, at, &byte, 1);
}

static int refit_dw_first_times(const refit_session_t *s, int32_t b, int64_t k,
                                refit_land_fault_t fault) {
  fault = refit_land_fault(fault);
  return k > s->my_begin[b]                  ? 1
         : fault == REFIT_LAND_DROP_ONE      ? 0
         : fault == REFIT_LAND_DUPLICATE_ONE ? 2
                                             : 1;
}

/* A message's chunks applied in place; `first` is how many times its chunk
 * 0 is (refit_dw_first_times). */
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
  REFIT_CHECK(refit_dw_flip(s, b, slot, staging, fault));
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
    refit_dw_place_t c = {s, m, tag, what, got == (size_t)m->bytes,
                          refit_dw_first_times(s, b, k, fault)};
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

/* A bucket's chunks on a GPU, gathered for one batch: a frame's deltas lie
 * at the same offsets of the frame in staging as in its host copy. */
typedef struct {
  refit_dw_t *dw;
  const unsigned char *host, *dev; /* the frame: host copy, in staging */
  int64_t k, chunk_begin, n;       /* message, its first plan chunk, entries */
  int first;                       /* times its chunk 0 is applied */
} refit_dw_gpu_t;

static refit_status_t refit_dw_gpu_add(refit_dw_gpu_t *c, int64_t i,
                                       const unsigned char *host,
                                       const unsigned char *dev, size_t len) {
  refit_dw_t *dw = c->dw;
  for (int t = 0; t < (i == 0 ? c->first : 1); t++) {
    if (c->n > dw->max_chunks)
      return REFIT_ERR(REFIT_ERR_INTERNAL, "delta refit: more chunks than the %lld sized",
                       (long long)dw->max_chunks);
    dw->batch[c->n] = (refit_loader_gpu_chunk_t){c->chunk_begin + i, host, dev, len,
                                                 host == NULL};
    dw->chunk_at[c->n][0] = c->k;
    dw->chunk_at[c->n][1] = i;
    c->n++;
  }
  return REFIT_OK;
}

static refit_status_t refit_dw_gpu_chunk(void *ctx, int64_t i, const unsigned char *delta,
                                         size_t len) {
  refit_dw_gpu_t *c = ctx;
  return refit_dw_gpu_add(c, i, delta, c->dev + (delta - c->host), len);
}

/* A delta refit's bucket b on a generator whose memory is a GPU: every
 * frame's deltas and every message that came whole, applied in place in one
 * batch (refit_loader_delta_gpu: all of the bucket checked, digests
 * included, before any byte is written). The land fault seam is played as
 * on a host generator. */
static refit_status_t refit_dw_generator_gpu(refit_session_t *s, int32_t b, int slot,
                                             unsigned char *staging,
                                             refit_land_fault_t fault) {
  refit_dw_t *dw = s->dw;
  const refit_plan_t *p = s->plan;
  const uint64_t tag = refit_seal_tag(s->pending, s->attempt);
  REFIT_CHECK(refit_dw_flip(s, b, slot, staging, fault));
  refit_dw_gpu_t c = {.dw = dw};
  size_t hoff = 0;
  for (int64_t k = s->my_begin[b]; k < s->my_begin[b + 1]; k++) {
    const refit_msg_t *m = &p->msgs[s->my_msgs[k]];
    const size_t got = dw->got[slot][k - s->my_begin[b]];
    dw->full_bytes += (uint64_t)m->bytes;
    dw->wire_bytes += got;
    refit_dw_spans(p, m, dw->span);
    c.k = k;
    c.chunk_begin = m->chunk_begin;
    c.first = refit_dw_first_times(s, b, k, fault);
    unsigned char *msg = staging + m->offset;
    if (got == (size_t)m->bytes) { /* whole: compared with runtime storage */
      for (int64_t i = 0; i < m->chunk_count; i++)
        REFIT_CHECK(refit_dw_gpu_add(&c, i, NULL, msg + dw->span[i],
                                     (size_t)(dw->span[i + 1] - dw->span[i])));
      continue;
    }
    char what[160];
    snprintf(what, sizeof(what),
             "version %llu bucket %d: message from trainer rank %d to generator rank %d",
             (unsigned long long)s->pending, b, m->src_rank, m->dst_rank);
    /* The frame's header, lengths and deltas' headers are read on the host:
     * a copy of the frame (the deltas only, a small part of the message). */
    if (got > dw->hframe_bytes - hoff)
      return REFIT_ERR(REFIT_ERR_INTERNAL, "%s: %zu frame bytes, %zu sized", what,
                       hoff + got, dw->hframe_bytes);
    REFIT_CHECK(refit_mem_to_host(dw->mem, dw->hframe + hoff, msg, got));
    c.host = dw->hframe + hoff;
    c.dev = msg;
    REFIT_CHECK(refit_dw_frame_walk(c.host, got, dw->span, m->chunk_count, what,
                                    refit_dw_gpu_chunk, &c));
    hoff += got;
    dw->framed_msgs++;
  }
  int64_t bad = -1;
  refit_status_t st = refit_loader_delta_gpu(s->loader, dw->batch, c.n, tag, &bad);
  if (st != REFIT_OK && bad >= 0 && bad < c.n) {
    char why[512];
    snprintf(why, sizeof(why), "%s", refit_last_error());
    const refit_msg_t *m = &p->msgs[s->my_msgs[dw->chunk_at[bad][0]]];
    char tensor[REFIT_NAME_MAX + 160];
    const int64_t pc = dw->batch[bad].chunk;
    const int64_t k = pc >= 0 && pc < p->nchunks ? s->loader->chunk_desc[pc] : -1;
    if (k >= 0)
      refit_loader_chunk_str(s->loader, k, tensor, sizeof(tensor));
    else
      snprintf(tensor, sizeof(tensor), "plan chunk %lld", (long long)pc);
    return REFIT_ERR(st, "version %llu bucket %d: chunk %lld of %lld of a message, %s: %s%s",
                     (unsigned long long)s->pending, b, (long long)dw->chunk_at[bad][1],
                     (long long)m->chunk_count, tensor, why,
                     st == REFIT_ERR_INTERNAL
                         ? ""
                         : "; nothing of the bucket was written, the refit is discarded");
  }
  return st;
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
    return dw->device ? refit_dw_generator_gpu(s, b, slot, staging, fault)
                      : refit_dw_generator_in_place(s, b, slot, staging, fault);
  }
  for (int64_t k = s->my_begin[b]; k < s->my_begin[b + 1]; k++)
    dw->full_bytes += (uint64_t)p->msgs[s->my_msgs[k]].bytes;
  dw->wire_bytes = dw->full_bytes;
  return REFIT_OK;
}

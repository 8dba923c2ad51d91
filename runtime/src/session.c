#include "session.h"

#include "fault.h"
#include "precision.h"

#include "core/digest.h"
#include "core/hash.h"
#include "core/log.h"
#include "kernels/mxfp8.h"
#ifdef REFIT_HAVE_CUDA
#include "device.h"
#endif

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* What every rank tells the others at begin. */
typedef struct refit_header {
  uint64_t run_id, version, plan_hash, committed;
  int32_t side, ok; /* ok: this rank could start (memory bound) */
  int32_t transport_ok, pad; /* transport_ok: its transport is healthy */
} refit_header_t;

/* Wait for a collective on the session's communicators until `deadline`.
 * A rank that did not join (or an MPI failure) breaks the session: the
 * request can be neither completed nor freed safely (its buffers stay
 * with MPI: they are the session's, kept by refit_session_destroy, or
 * leaked), and no later collective can succeed. `limit` names the bound
 * for the message. */
static refit_status_t refit_session_join_wait(refit_session_t *s, MPI_Request *req,
                                              double deadline, const char *what,
                                              const char *limit, double limit_s) {
  refit_status_t st = refit_mpi_request_wait(req, deadline, what);
  if (st == REFIT_OK)
    return REFIT_OK;
  s->broken = 1;
  if (st != REFIT_ERR_TIMEOUT)
    return st;
  return REFIT_ERR(REFIT_ERR_TIMEOUT,
                   "%s: not every rank joined within %s = %.1f s (a peer is dead, "
                   "stalled or not started); this session cannot continue",
                   what, limit, limit_s);
}

/* Start-up collectives are non-blocking and waited on against a deadline,
 * so a peer that dies during refit_session_open is an error, not a hang:
 * REFIT_STARTUP_TIMEOUT_S (default 300) until the config is known, then
 * refit.timeout_s. `rc` is the MPI call that started the request. */
static refit_status_t refit_session_startup_wait(refit_session_t *s, MPI_Request *req,
                                                 int rc, const char *what) {
  char phase[160];
  if (rc != MPI_SUCCESS)
    return REFIT_ERR(REFIT_ERR_MPI, "start-up: %s: MPI call failed", what);
  snprintf(phase, sizeof(phase), "start-up: %s", what);
  return refit_session_join_wait(s, req, MPI_Wtime() + s->startup_timeout_s, phase,
                                 "the start-up deadline (REFIT_STARTUP_TIMEOUT_S "
                                 "before the config is read, refit.timeout_s after)",
                                 s->startup_timeout_s);
}

/* Every rank learns whether any rank failed `phase`; a rank that did not
 * fail itself returns REFIT_ERR_PEER. */
static refit_status_t refit_session_agree(refit_session_t *s, refit_status_t st,
                                          const char *phase) {
  int *buf = s->startup_buf; /* [0] mine, [1] anyone's */
  MPI_Request req;
  /* A collective of this rank already missed its deadline (a transport's
   * start-up): a peer is gone, and agreeing would only wait again. */
  if (st == REFIT_ERR_TIMEOUT) {
    s->broken = 1;
    return st;
  }
  buf[0] = st != REFIT_OK;
  buf[1] = 0;
  REFIT_CHECK(refit_session_startup_wait(
      s, &req, MPI_Iallreduce(&buf[0], &buf[1], 1, MPI_INT, MPI_MAX, s->world, &req),
      phase));
  if (st != REFIT_OK)
    return st;
  if (buf[1])
    return REFIT_ERR(REFIT_ERR_PEER, "%s failed on another rank", phase);
  return REFIT_OK;
}

/* Collective: does every rank hold the same value `h`? (*same) */
static refit_status_t refit_session_same(refit_session_t *s, uint64_t h, int *same,
                                         const char *what) {
  uint64_t *range = s->startup_u64; /* [0..1] in, [2..3] out */
  MPI_Request req;
  range[0] = h;
  range[1] = ~h;
  /* One reduction: the max of h and the max of ~h (the min of h). */
  REFIT_CHECK(refit_session_startup_wait(
      s, &req, MPI_Iallreduce(range, range + 2, 2, MPI_UINT64_T, MPI_MAX, s->world, &req),
      what));
  *same = range[2] == h && ~range[3] == h;
  return REFIT_OK;
}

/* MPI_Ibcast from rank 0, waited on against the start-up deadline. */
static refit_status_t refit_session_bcast(refit_session_t *s, void *buf, int count,
                                          MPI_Datatype type, const char *what) {
  MPI_Request req;
  return refit_session_startup_wait(s, &req,
                                    MPI_Ibcast(buf, count, type, 0, s->world, &req), what);
}

/* Rank 0 reads and validates; the others receive the parsed config. */
static refit_status_t refit_session_config(refit_session_t *s, const char *path) {
  refit_status_t st = REFIT_OK;
  unsigned long long len = 0;
  if (s->rank == 0) {
    char *errors = NULL;
    st = refit_config_load(path, s->size, &s->cfg, &errors, &s->config_text,
                           &s->config_len);
    if (st != REFIT_OK) {
      fprintf(stderr, "%s", errors ? errors : refit_last_error());
      if (errors != NULL && errors[0] != '\0' &&
          errors[strlen(errors) - 1] != '\n')
        fputc('\n', stderr);
      free(errors);
      refit_error_set(st, "config %s rejected (problems listed above)", path);
    } else {
      len = s->config_len;
    }
  }
  REFIT_CHECK(refit_session_agree(s, st, "reading the config"));
  s->startup_u64[0] = len;
  REFIT_CHECK(refit_session_bcast(s, s->startup_u64, 1, MPI_UINT64_T, "config size"));
  len = s->startup_u64[0];
  if (s->rank != 0) {
    s->config_text = malloc(len + 1);
    if (s->config_text == NULL)
      st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "config text of %llu bytes", len);
    else
      s->config_text[len] = '\0';
    s->config_len = len;
  }
  REFIT_CHECK(refit_session_agree(s, st, "receiving the config"));
  REFIT_CHECK(refit_session_bcast(s, s->config_text, (int)len, MPI_CHAR, "config text"));
  REFIT_CHECK(refit_session_bcast(s, &s->cfg, (int)sizeof(s->cfg), MPI_BYTE, "config"));
  s->startup_timeout_s = s->cfg.refit.timeout_s;

  /* Prove every rank holds the same config with the same binary layout. */
  uint64_t h = refit_hash_bytes(REFIT_HASH_INIT, s->config_text, len);
  h = refit_hash_bytes(h, &s->cfg, sizeof(s->cfg));
  int same = 0;
  REFIT_CHECK(refit_session_same(s, h, &same, "config hash"));
  if (!same)
    return REFIT_ERR(REFIT_ERR_CONFIG,
                     "config hash differs between ranks (%016llx on rank %d): "
                     "are all ranks running the same refit build?",
                     (unsigned long long)h, s->rank);
  return REFIT_OK;
}

/* Plan from the catalog's quantized flags (collective: st is this rank's
 * outcome so far), compare hashes, index this rank's messages. */
static refit_status_t refit_session_make_plan(refit_session_t *s, refit_status_t st) {
  refit_plan_options_t opt;
  refit_config_plan_options(&s->cfg, &opt);
  if (st == REFIT_OK)
    st = refit_plan_create(s->cat, &opt, &s->plan);
  REFIT_CHECK(refit_session_agree(s, st, "planning"));

  int same = 0;
  REFIT_CHECK(refit_session_same(s, s->plan->hash, &same, "plan hash"));
  if (!same)
    return REFIT_ERR(REFIT_ERR_INTERNAL,
                     "plan hash differs between ranks (%016llx on rank %d)",
                     (unsigned long long)s->plan->hash, s->rank);

  /* Index this rank's messages by bucket. */
  const refit_plan_t *p = s->plan;
  int64_t n = 0;
  s->my_begin = calloc((size_t)p->nbuckets + 1, sizeof(int64_t));
  s->my_msgs = malloc((size_t)(p->nmsgs ? p->nmsgs : 1) * sizeof(int64_t));
  if (s->my_begin == NULL || s->my_msgs == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "message index");
  for (int32_t b = 0; b < p->nbuckets; b++) {
    s->my_begin[b] = n;
    for (int64_t i = p->bucket_msg_begin[b]; i < p->bucket_msg_begin[b + 1]; i++) {
      const refit_msg_t *m = &p->msgs[i];
      if ((s->is_trainer && m->src_rank == s->role_rank) ||
          (!s->is_trainer && m->dst_rank == s->role_rank))
        s->my_msgs[n++] = i;
    }
  }
  s->my_begin[p->nbuckets] = n;
  return REFIT_OK;
}

static refit_status_t refit_session_plan(refit_session_t *s) {
  refit_status_t st = refit_catalog_create(&s->cfg.model, &s->cfg.trainer,
                                           &s->cfg.generator, &s->cat);
  if (st == REFIT_OK) {
    refit_config_mark_quantized(&s->cfg, s->cat);
    const int64_t n = s->cat->gen_begin[s->cat->generator.tp];
    s->form_votes = calloc((size_t)(2 * n + 2), 1);
    if (s->form_votes == NULL)
      st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "form votes of %lld tensors", (long long)n);
  }
  return refit_session_make_plan(s, st);
}

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
    uint64_t key;
    int norm;
    REFIT_CHECK(s->source.ops->synth_key(s->source.ctx, hf, version, &key, &norm));
    return refit_mem_synth_rect(s->mem, key, norm, hf->cols, row0, col0, rows, cols, dst);
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
  REFIT_CHECK(s->source.ops->read(s->source.ctx, hf, version, row0, col0, rows, cols,
                                  *bounce));
  return refit_mem_from_host(s->mem, dst, *bounce, bytes);
}

/* Trainer: new weights of `version` into every shard this rank holds, from
 * the source's Hugging Face tensors through each trainer tensor's row runs
 * (rows in no run, Megatron's vocabulary padding, become zeros). Not called
 * for source.kind caller: the trainer's tensors are then the caller's. */
static refit_status_t refit_trainer_source(refit_session_t *s, uint64_t version) {
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

/* Trainer: one pack descriptor per chunk this rank sends, bucket by bucket,
 * against the send buffer layout (messages back to back in plan order). */
/* The pack operation of chunk ch on this trainer. */
static int refit_trainer_chunk_op(const refit_session_t *s, const refit_chunk_t *ch) {
  return s->plan->options.wire == REFIT_WIRE_MXFP8 && s->cat->gen[ch->dst_tensor].quantized
             ? REFIT_CHUNK_QUANTIZE
             : REFIT_CHUNK_COPY;
}

/* Do messages a and b carry the same bytes: the same chunks of the same
 * source rectangles, packed the same way at the same places? */
static int refit_trainer_same_msg(const refit_session_t *s, const refit_msg_t *a,
                                  const refit_msg_t *b) {
  const refit_plan_t *p = s->plan;
  if (a->bytes != b->bytes || a->chunk_count != b->chunk_count)
    return 0;
  for (int64_t i = 0; i < a->chunk_count; i++) {
    const refit_chunk_t *x = &p->chunks[a->chunk_begin + i];
    const refit_chunk_t *y = &p->chunks[b->chunk_begin + i];
    if (x->src_tensor != y->src_tensor || x->src_row != y->src_row ||
        x->src_col != y->src_col || x->rows != y->rows || x->cols != y->cols ||
        x->row_bytes != y->row_bytes || x->offset - a->offset != y->offset - b->offset ||
        refit_trainer_chunk_op(s, x) != refit_trainer_chunk_op(s, y))
      return 0;
  }
  return 1;
}

static refit_status_t refit_trainer_tables(refit_session_t *s) {
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
  if (d == NULL || s->pack_begin == NULL || s->msg_wire == NULL ||
      s->pack_src == NULL || s->pack_elem == NULL) {
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
        if (refit_trainer_same_msg(s, &p->msgs[s->my_msgs[k0]], m))
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
        /* Prequantize: blocks never cross rows, so quantizing chunk rows on
         * the trainer equals quantizing the whole tensor. */
        d[j].op = refit_trainer_chunk_op(s, ch);
        d[j].digest = p->options.chunk_trailer > 0;
        d[j].seal_key = refit_seal_key(s->run_id, b, ch->src_tensor, ch->src_row,
                                       ch->src_col);
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
static refit_status_t refit_trainer_repoint(refit_session_t *s) {
  refit_pack_desc_t *d = s->pack.host;
  for (int64_t j = 0; j < s->pack.count; j++)
    d[j].src = s->shards[s->pack_src[j]] + s->pack_elem[j];
  s->moved = 0;
  REFIT_CHECK(refit_pack_descs_check(d, s->pack.count));
  return refit_mem_table_refresh(s->mem, &s->pack, sizeof(refit_pack_desc_t));
}

/* Trainer: pack bucket b into `buf` (messages with the same bytes share
 * them) and list its sends. */
static refit_status_t refit_trainer_pack(refit_session_t *s, int32_t b,
                                         unsigned char *buf, refit_xfer_t *xfers,
                                         int *nxfers, int wait_done) {
  const refit_plan_t *p = s->plan;
  *nxfers = 0;
  for (int64_t k = s->my_begin[b]; k < s->my_begin[b + 1]; k++) {
    const refit_msg_t *m = &p->msgs[s->my_msgs[k]];
    xfers[*nxfers].peer = s->ntrainer + m->dst_rank;
    xfers[*nxfers].buf = buf + s->msg_wire[k];
    xfers[*nxfers].bytes = (size_t)m->bytes;
    (*nxfers)++;
  }
  REFIT_CHECK(refit_mem_pack(s->mem, &s->pack, s->pack_begin[b],
                             s->pack_begin[b + 1] - s->pack_begin[b],
                             refit_seal_tag(s->pending, s->attempt), buf));
  return wait_done ? refit_mem_sync(s->mem) : REFIT_OK;
}

/* Generator: receives of bucket b into the staging area `buf`. */
static void refit_generator_recvs(refit_session_t *s, int32_t b,
                                  unsigned char *buf, refit_xfer_t *xfers,
                                  int *nxfers) {
  const refit_plan_t *p = s->plan;
  *nxfers = 0;
  for (int64_t k = s->my_begin[b]; k < s->my_begin[b + 1]; k++) {
    const refit_msg_t *m = &p->msgs[s->my_msgs[k]];
    xfers[*nxfers].peer = m->src_rank;
    xfers[*nxfers].buf = buf + m->offset;
    xfers[*nxfers].bytes = (size_t)m->bytes;
    (*nxfers)++;
  }
}

/* Trainer: find the shard of each catalog tensor this rank holds. Memory is
 * attached later (registered by the caller or allocated at bind time). */
static refit_status_t refit_session_index_trainer(refit_session_t *s) {
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

/* refit.keep_staging: false gives the staging memory back between refits
 * (colocated jobs need it for training) and takes it again at begin. */
static void refit_session_release_staging(refit_session_t *s) {
  if (s->cfg.refit.keep_staging || s->staging_released)
    return;
  for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++) {
    refit_mem_free(s->mem, s->buffer[i]);
    s->buffer[i] = NULL;
  }
  if (s->loader != NULL)
    refit_loader_release(s->loader);
  s->staging_released = 1;
}

static refit_status_t refit_session_alloc_buffers(refit_session_t *s);

static refit_status_t refit_session_acquire_staging(refit_session_t *s) {
  if (!s->staging_released)
    return REFIT_OK;
  REFIT_CHECK(refit_session_alloc_buffers(s));
  if (s->loader != NULL)
    REFIT_CHECK(refit_loader_acquire(s->loader));
  s->staging_released = 0;
  return REFIT_OK;
}

static refit_status_t refit_session_alloc_buffers(refit_session_t *s) {
  int64_t need = 0, max_msgs = 1;
  for (int32_t b = 0; b < s->plan->nbuckets; b++)
    if (s->my_begin[b + 1] - s->my_begin[b] > max_msgs)
      max_msgs = s->my_begin[b + 1] - s->my_begin[b];
  if (s->xfers == NULL)
    s->xfers = malloc((size_t)max_msgs * sizeof(*s->xfers));
  if (s->xfers == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "transfer list of %lld", (long long)max_msgs);
  if (s->is_trainer) {
    for (int32_t b = 0; b < s->plan->nbuckets; b++) {
      int64_t bytes = 0;
      for (int64_t k = s->my_begin[b]; k < s->my_begin[b + 1]; k++)
        bytes += s->plan->msgs[s->my_msgs[k]].bytes;
      if (bytes > need)
        need = bytes;
    }
  } else {
    need = s->plan->staging[s->role_rank];
  }
  for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++)
    REFIT_CHECK(refit_mem_alloc(s->mem, (size_t)need, (void **)&s->buffer[i]));
  return REFIT_OK;
}

/* The (sender, receiver) world-rank pairs of the plan's messages, each once
 * (trainers are world ranks 0 .. T-1, generators T onwards). */
static refit_status_t refit_session_pairs(const refit_session_t *s, int **out,
                                          int *nout) {
  const refit_plan_t *p = s->plan;
  const int64_t ngen = s->size - s->ntrainer;
  unsigned char *seen = calloc((size_t)s->ntrainer * (size_t)(ngen > 0 ? ngen : 1), 1);
  int *pairs = malloc((size_t)(p->nmsgs ? p->nmsgs : 1) * 2 * sizeof(int));
  int n = 0;
  if (seen == NULL || pairs == NULL) {
    free(seen);
    free(pairs);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "pairs of %lld messages", (long long)p->nmsgs);
  }
  for (int64_t i = 0; i < p->nmsgs; i++) {
    const refit_msg_t *m = &p->msgs[i];
    unsigned char *x = &seen[(size_t)m->src_rank * (size_t)ngen + (size_t)m->dst_rank];
    if (*x)
      continue;
    *x = 1;
    pairs[2 * n] = m->src_rank;
    pairs[2 * n + 1] = s->ntrainer + m->dst_rank;
    n++;
  }
  free(seen);
  *out = pairs;
  *nout = n;
  return REFIT_OK;
}

static refit_status_t refit_session_fault_act(refit_session_t *s, const char *where);

/* Open the transport between the plan's (sender, receiver) pairs
 * (collective). */
static refit_status_t refit_session_open_transport(refit_session_t *s) {
  int *pairs = NULL, npairs = 0;
  refit_status_t st = refit_session_pairs(s, &pairs, &npairs);
  refit_transport_args_t args = {.world = s->world,
                                 .world_rank = s->rank,
                                 .world_size = s->size,
                                 .timeout_s = s->cfg.refit.timeout_s,
                                 .memory = refit_mem_on_device(s->mem) ? REFIT_MEMORY_DEVICE
                                                                       : REFIT_MEMORY_HOST,
                                 .pairs = pairs,
                                 .npairs = npairs,
                                 .locality = s->cfg.refit.locality};
  if (st == REFIT_OK)
    st = refit_transport_open(s->cfg.refit.transport, &args, &s->transport);
  free(pairs);
  return refit_session_agree(s, st, "opening the transport");
}

/* Transports that write into their peers' memory learn the staging areas
 * once (collective: every rank registers the same number of times); st is
 * this rank's outcome so far. */
static refit_status_t refit_session_register_staging(refit_session_t *s,
                                                     refit_status_t st) {
  for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT && st == REFIT_OK; i++)
    st = refit_transport_register(&s->transport, s->is_trainer ? NULL : s->buffer[i],
                                  s->is_trainer ? 0 : (size_t)s->plan->staging[s->role_rank]);
  REFIT_CHECK(refit_session_agree(s, st, "registering staging"));
  if (!s->cfg.refit.keep_staging && s->transport.ops->register_buffer != NULL)
    return REFIT_ERR(REFIT_ERR_CONFIG,
                     "refit.keep_staging: false cannot be used with the %s transport, "
                     "which registers staging buffers with its peers once; use "
                     "refit.transport: nccl (or keep_staging: true)",
                     s->transport.ops->name);
  return REFIT_OK;
}

refit_status_t refit_session_create(MPI_Comm world, const char *config_path,
                                    refit_session_t **out) {
  refit_status_t st;
  refit_session_t *s = calloc(1, sizeof(*s));
  if (s == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "session");
  s->world = MPI_COMM_NULL;
  s->ctrl = MPI_COMM_NULL;
  MPI_Comm_rank(world, &s->rank);
  MPI_Comm_size(world, &s->size);
  s->startup_timeout_s = 300;
  const char *startup = getenv("REFIT_STARTUP_TIMEOUT_S");
  if (startup != NULL && atof(startup) > 0)
    s->startup_timeout_s = atof(startup);
  /* A library keeps its traffic off the application's communicator: every
   * collective of the session runs on a duplicate of it. */
  {
    MPI_Request req;
    st = refit_session_startup_wait(s, &req, MPI_Comm_idup(world, &s->world, &req),
                                    "duplicating the communicator");
    if (st != REFIT_OK)
      return st; /* s stays with the pending duplicate */
  }
  refit_log_set_rank(s->rank);

  REFIT_CHECK_GOTO(refit_session_config(s, config_path), st, err);
  s->ntrainer = refit_trainer_world(&s->cfg.trainer);
  s->ngenerator = refit_generator_world(&s->cfg.generator);
  s->is_trainer = s->rank < s->ntrainer;
  s->role_rank = s->is_trainer ? s->rank : s->rank - s->ntrainer;
  s->tp_rank = s->is_trainer ? 0 : s->role_rank % s->cfg.generator.tp;
  s->engine = s->is_trainer ? 0 : s->role_rank / s->cfg.generator.tp;
  REFIT_CHECK_GOTO(refit_session_plan(s), st, err);

  /* Headers and votes travel on their own communicator, with errors
   * returned rather than fatal, so a dead peer is a deadline, not an abort. */
  {
    MPI_Request req;
    REFIT_CHECK_GOTO(refit_session_startup_wait(s, &req, MPI_Comm_idup(s->world, &s->ctrl, &req),
                                                "the control communicator"),
                     st, err);
  }
  MPI_Comm_set_errhandler(s->ctrl, MPI_ERRORS_RETURN);
  {
    int *ub = NULL, flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    s->attempt_mask = flag && ub != NULL && *ub >= (0x7fff << 12 | 0xfff) ? 0x7fffu : 7u;
  }
  s->header_buf = malloc((size_t)(s->size + 1) * sizeof(refit_header_t));
  s->vote_buf = malloc((size_t)(s->size + 1) * sizeof(int));
  if (s->header_buf == NULL || s->vote_buf == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "session: control buffers");
    goto err;
  }
  s->run_id = refit_hash_u64(s->plan->hash, (uint64_t)time(NULL));
  s->startup_u64[0] = s->run_id;
  REFIT_CHECK_GOTO(refit_session_bcast(s, s->startup_u64, 1, MPI_UINT64_T, "run id"), st,
                   err);
  s->run_id = s->startup_u64[0];
  st = refit_fault_from_env(&s->cfg, s->size, &s->fault);
  REFIT_CHECK_GOTO(refit_session_agree(s, st, "reading REFIT_FAULT"), st, err);

  /* Device memory when this rank sees a GPU, the job does not bind ranks
   * away from GPUs, and the transport can move device memory (MPI cannot;
   * UCX can where its build has CUDA, which its query() checks); every rank
   * must agree, or host memory is used everywhere. */
  int want_device = refit_mem_gpu_count() > 0 &&
                    s->cfg.refit.device_map != REFIT_DEVICE_MAP_NONE &&
                    s->cfg.refit.transport != REFIT_TRANSPORT_MPI;
  int all_device = 0;
  {
    MPI_Request req;
    s->startup_buf[0] = want_device;
    REFIT_CHECK_GOTO(refit_session_startup_wait(
                         s, &req,
                         MPI_Iallreduce(&s->startup_buf[0], &s->startup_buf[1], 1, MPI_INT,
                                        MPI_MIN, s->world, &req),
                         "choosing memory"),
                     st, err);
    all_device = s->startup_buf[1];
  }
  if ((s->cfg.refit.transport == REFIT_TRANSPORT_NCCL ||
       s->cfg.refit.transport == REFIT_TRANSPORT_IPC) && !all_device) {
    st = REFIT_ERR(REFIT_ERR_CONFIG,
                   "refit.transport %s moves GPU memory, but not every rank sees "
                   "a GPU (rank %d sees %d) or refit.device_map is none",
                   s->cfg.refit.transport == REFIT_TRANSPORT_NCCL ? "nccl" : "ipc",
                   s->rank, refit_mem_gpu_count());
    goto err;
  }
  st = REFIT_OK;
#ifdef REFIT_HAVE_CUDA
  if (all_device) {
    refit_device_info_t info;
    st = refit_device_bind(s->world, -1, s->cfg.refit.timeout_s, &info);
    if (st == REFIT_OK)
      REFIT_INFO("rank %d bound to GPU %d (%s) on %s", s->rank, info.device,
                 info.bus_id, info.host);
  }
#endif
  if (st == REFIT_OK)
    st = refit_mem_create(all_device, &s->mem);
  REFIT_CHECK_GOTO(refit_session_agree(s, st, "choosing memory"), st, err);

  /* Fault seam: a rank that dies (or stalls) just as the transports start
   * up; its peers' start-up collectives must end at their deadline. */
  if (s->fault.enabled && s->fault.phase == REFIT_FAULT_PHASE_OPEN &&
      s->fault.rank == s->rank)
    REFIT_CHECK_GOTO(refit_session_fault_act(s, "opening the transport"), st, err);
  REFIT_CHECK_GOTO(refit_session_open_transport(s), st, err);
  /* The source generators verify against, and trainers produce from: with
   * caller-owned weights, the configured reference (trainers produce
   * nothing). */
  if (s->cfg.source.kind == REFIT_SOURCE_CALLER) {
    refit_config_t ref = s->cfg;
    ref.source.kind = s->cfg.reference.kind;
    ref.source.seed = s->cfg.reference.seed;
    memcpy(ref.source.path, s->cfg.reference.path, sizeof(ref.source.path));
    st = s->is_trainer ? REFIT_OK : refit_source_open(&ref, s->cat, &s->source);
  } else {
    st = refit_source_open(&s->cfg, s->cat, &s->source);
  }
  REFIT_CHECK_GOTO(refit_session_agree(s, st, "opening the source"), st, err);
  if (s->is_trainer) {
    st = refit_session_index_trainer(s);
  } else {
    st = refit_loader_create(s->cat, &s->cfg, s->mem, s->tp_rank, s->role_rank,
                             s->plan, &s->loader);
    if (st == REFIT_OK) {
      s->loader->run_id = s->run_id;
      s->stores = s->loader->stores;
      s->nstores = s->loader->nstores;
    }
  }
  if (st == REFIT_OK)
    st = refit_session_alloc_buffers(s);
  REFIT_CHECK_GOTO(refit_session_agree(s, st, "allocating memory"), st, err);
  REFIT_CHECK_GOTO(refit_session_register_staging(s, st), st, err);
  s->state = REFIT_STATE_IDLE;
  *out = s;
  return REFIT_OK;

err:
  refit_session_destroy(s);
  return st;
}

void refit_session_destroy(refit_session_t *s) {
  if (s == NULL)
    return;
  refit_transport_close(&s->transport);
  refit_source_close(&s->source);
  if (s->shards != NULL)
    for (int64_t i = 0; i < s->cat->nsrc; i++)
      if (s->shard_owned[i])
        refit_mem_free(s->mem, s->shards[i]);
  free(s->shards);
  free(s->held);
  free(s->held_at);
  free(s->shard_part);
  free(s->shard_owned);
  refit_loader_destroy(s->loader);
  free(s->regs);
  for (int i = 0; s->mem != NULL && i < REFIT_EXCHANGES_IN_FLIGHT; i++)
    if (s->buffer[i] != NULL)
      refit_mem_free(s->mem, s->buffer[i]);
  if (s->mem != NULL)
    refit_mem_table_free(s->mem, &s->pack);
  free(s->pack_begin);
  free(s->msg_wire);
  free(s->pack_src);
  free(s->pack_elem);
  refit_mem_destroy(s->mem);
  free(s->xfers);
  free(s->my_msgs);
  free(s->my_begin);
  refit_plan_destroy(s->plan);
  refit_catalog_destroy(s->cat);
  free(s->config_text);
  if (s->ctrl != MPI_COMM_NULL && !s->broken)
    MPI_Comm_free(&s->ctrl);
  if (s->world != MPI_COMM_NULL && !s->broken)
    MPI_Comm_free(&s->world);
  /* After a collective missed its deadline MPI may still write the
   * session's buffers (headers, votes, start-up values): kept. */
  if (s->broken)
    return;
  free(s->header_buf);
  free(s->vote_buf);
  free(s->form_votes);
  free(s);
}

/* Append one problem to a registration's list ("; "-separated). */
static void refit_register_problem(char *buf, size_t len, size_t *used, int *n,
                                   const char *fmt, ...) REFIT_PRINTF(5, 6);
static void refit_register_problem(char *buf, size_t len, size_t *used, int *n,
                                   const char *fmt, ...) {
  va_list ap;
  if (*used < len)
    *used += (size_t)snprintf(buf + *used, len - *used, "%s", *n ? "; " : "");
  va_start(ap, fmt);
  if (*used < len)
    *used += (size_t)vsnprintf(buf + *used, len - *used, fmt, ap);
  va_end(ap);
  (*n)++;
}

/* "[a, b]" of a registration's shape, or of an expected one. */
static void refit_shape_str(int ndim, const int64_t *shape, char *buf, size_t len) {
  size_t used = (size_t)snprintf(buf, len, "[");
  for (int d = 0; d < ndim && used < len; d++)
    used += (size_t)snprintf(buf + used, len - used, "%s%lld", d ? ", " : "",
                             (long long)shape[d]);
  if (used < len)
    snprintf(buf + used, len - used, "]");
}

/* Does a registration's shape match? ndim 0 gives none (bytes decide); a
 * tensor of one row may come as [n] or [1, n]. */
static int refit_shape_matches(const refit_tensor_t *t, int ndim, const int64_t *shape) {
  if (t->ndim == 0)
    return 1;
  if (t->ndim == ndim && memcmp(t->shape, shape, (size_t)ndim * sizeof(int64_t)) == 0)
    return 1;
  return ndim == 2 && shape[0] == 1 && t->ndim == 1 && t->shape[0] == shape[1];
}

/* vLLM spells the expert stacks "mlp.experts.w13_weight" or, in newer
 * versions, "mlp.experts.routed_experts.w13_weight": the engine registers
 * its own spelling, which becomes the store's name. */
int refit_store_name_matches(const char *store, const char *name) {
  static const char nested[] = ".mlp.experts.routed_experts.";
  const char *at = strstr(name, nested);
  if (strcmp(store, name) == 0)
    return 1;
  if (at == NULL)
    return 0;
  const size_t head = (size_t)(at - name) + strlen(".mlp.experts.");
  return strncmp(store, name, head) == 0 &&
         strcmp(store + head, at + strlen(nested)) == 0;
}

/* A generator registration before the first begin, kept with its form. */
struct refit_registration {
  refit_tensor_t t;
  char name[REFIT_NAME_MAX + 8];
  int form;    /* REFIT_FORM_* */
  int64_t gen; /* catalog generator tensor */
};

static refit_status_t refit_session_keep_registration(refit_session_t *s,
                                                      const refit_tensor_t *t, int form,
                                                      int64_t gen) {
  for (int64_t i = 0; i < s->nregs; i++)
    if (s->regs[i].form != REFIT_FORM_PLANNED && strcmp(s->regs[i].name, t->name) == 0)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "register: tensor '%s' registered twice on generator rank %d",
                       t->name, s->role_rank);
  if (strlen(t->name) >= sizeof(s->regs[0].name))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "register: generator rank %d holds no tensor '%s' (an unexpected "
                     "tensor)", s->role_rank, t->name);
  if (s->nregs == s->regs_cap) {
    const int64_t cap = s->regs_cap ? 2 * s->regs_cap : 64;
    struct refit_registration *r = realloc(s->regs, (size_t)cap * sizeof(*r));
    if (r == NULL)
      return REFIT_ERR(REFIT_ERR_NO_MEMORY, "registrations");
    s->regs = r;
    s->regs_cap = cap;
  }
  struct refit_registration *r = &s->regs[s->nregs++];
  r->t = *t;
  snprintf(r->name, sizeof(r->name), "%s", t->name);
  r->t.name = NULL; /* r->name, set when replayed (regs may move) */
  r->form = form;
  r->gen = gen;
  return REFIT_OK;
}

refit_status_t refit_session_register(refit_session_t *s, const refit_tensor_t *t) {
  const char *side = s->is_trainer ? "trainer" : "generator";
  const char *name = t->name;
  char problems[1024] = "", want[64], got[64];
  size_t used = 0;
  int n = 0;

  if (s->bound && !s->is_trainer)
    return REFIT_ERR(REFIT_ERR_STATE,
                     "register %s: generator runtime storage never moves (CUDA "
                     "graphs captured its addresses); register it before the "
                     "first refit_begin",
                     name);
  if (s->bound && s->state != REFIT_STATE_IDLE && s->state != REFIT_STATE_POISONED)
    return REFIT_ERR(REFIT_ERR_STATE,
                     "register %s: trainer rank %d is in a refit (%s); move a "
                     "tensor only between refit_commit and the next refit_begin",
                     name, s->role_rank, refit_state_str(s->state));
  int ndim;
  int64_t shape[3] = {0, 0, 0};
  size_t bytes;
  refit_dtype_t dtype;
  int64_t index = -1;
  if (s->is_trainer) {
    index = refit_catalog_find_src(s->cat, name, s->role_rank);
    if (index < 0)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "register: trainer rank %d holds no tensor '%s' (an "
                       "unexpected tensor; refit_tensor_get lists what this "
                       "rank holds under trainer.layout %s)",
                       s->role_rank, name,
                       s->cfg.trainer.names == REFIT_TRAINER_NAMES_MEGATRON ? "megatron"
                                                                            : "hf");
    refit_src_shard_shape(&s->cat->src[index], &shape[0], &shape[1]);
    ndim = 2;
    bytes = (size_t)(shape[0] * shape[1]) * 2;
    dtype = REFIT_DTYPE_BF16;
    if (s->shards[index] != NULL && !s->bound)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "register: tensor '%s' registered twice on trainer rank %d",
                       name, s->role_rank);
  } else {
    for (int64_t i = 0; i < s->nstores && index < 0; i++)
      if (refit_store_name_matches(s->stores[i].name, name))
        index = i;
    /* The other precision's form of a runtime tensor: the engine decides
     * (precision.h); checked against the stores it makes at the first begin. */
    const refit_store_t *found = index >= 0 ? &s->stores[index] : NULL;
    if (!s->replaying && !s->precision_settled && (found == NULL || (int)t->dtype != (int)found->dtype)) {
      int64_t gen = -1;
      const int form = refit_precision_form(&s->cfg, s->cat, s->stores, s->nstores, found,
                                            t, &gen);
      if (form != 0)
        return refit_session_keep_registration(s, t, form, gen);
    }
    if (index < 0)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "register: generator rank %d holds no tensor '%s' (an "
                       "unexpected tensor)",
                       s->role_rank, name);
    const refit_store_t *st = &s->stores[index];
    if (st->data != NULL)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "register: tensor '%s' registered twice on generator rank %d",
                       name, s->role_rank);
    ndim = st->ndim;
    memcpy(shape, st->shape, sizeof(shape));
    bytes = st->bytes;
    dtype = st->dtype;
  }
  /* Every problem of this tensor at once. */
  refit_shape_str(ndim, shape, want, sizeof(want));
  refit_shape_str(t->ndim, t->shape, got, sizeof(got));
  if (!refit_shape_matches(t, ndim, shape))
    refit_register_problem(problems, sizeof(problems), &used, &n,
                           "shape: expected %s, got %s", want, got);
  if ((int)t->dtype != (int)dtype)
    refit_register_problem(
        problems, sizeof(problems), &used, &n, "dtype: expected %s, got %s%s",
        refit_dtype_name(dtype), refit_dtype_name((refit_dtype_t)t->dtype),
        s->is_trainer || dtype != REFIT_DTYPE_BF16 ? ""
        : s->cat->gen[s->stores[index].gen].kind == REFIT_GEN_PLAIN
            ? " (vLLM keeps this tensor in bf16: it has no quantization method)"
            : " (refit.precision is not mxfp8: nothing is quantized)");
  if (t->bytes != bytes)
    refit_register_problem(problems, sizeof(problems), &used, &n,
                           "bytes: expected %zu, got %zu", bytes, t->bytes);
  if (!refit_mem_usable(s->mem, t->data))
    refit_register_problem(problems, sizeof(problems), &used, &n,
                           "device: the rank runs on %s, this memory is not there "
                           "(register %s)",
                           refit_mem_on_device(s->mem) ? "its GPU" : "the host",
                           refit_mem_on_device(s->mem) ? "cudaMalloc'd memory of that GPU"
                                                       : "host memory");
  if (n > 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "register: %s rank %d tensor '%s': %s",
                     side, s->role_rank, name, problems);
  if (!s->is_trainer) {
    refit_store_t *st = &s->stores[index];
    if (!s->replaying)
      REFIT_CHECK(refit_session_keep_registration(s, t, REFIT_FORM_PLANNED, st->gen));
    if (strcmp(st->name, name) != 0)
      snprintf(st->name, sizeof(st->name), "%s", name);
    st->data = t->data;
    s->nregistered++;
    return REFIT_OK;
  }
  if (s->bound) {
    /* Between refits: a new address for a tensor the caller owns. */
    if (s->shard_owned[index])
      return REFIT_ERR(REFIT_ERR_STATE,
                       "register %s: trainer rank %d allocated this tensor itself "
                       "(nothing was registered before the first refit_begin); "
                       "register every tensor before it to own them",
                       name, s->role_rank);
    if (s->shards[index] != t->data) {
      s->shards[index] = t->data;
      s->moved = 1;
    }
    return REFIT_OK;
  }
  s->shards[index] = t->data;
  s->nregistered++;
  return REFIT_OK;
}

/* The engine's forms changed which tensors are MXFP8: plan again, open the
 * transport for the new pairs, make the generator's stores again and check
 * every registration against them (collective, first begin). */
static refit_status_t refit_session_replan(refit_session_t *s) {
  for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++) {
    refit_mem_free(s->mem, s->buffer[i]);
    s->buffer[i] = NULL;
  }
  free(s->xfers);
  free(s->my_begin);
  free(s->my_msgs);
  s->xfers = NULL;
  s->my_begin = NULL;
  s->my_msgs = NULL;
  refit_plan_destroy(s->plan);
  s->plan = NULL;
  REFIT_CHECK(refit_session_make_plan(s, REFIT_OK));
  refit_transport_close(&s->transport);
  REFIT_CHECK(refit_session_open_transport(s));
  refit_status_t st = REFIT_OK;
  if (!s->is_trainer) {
    refit_loader_destroy(s->loader);
    s->loader = NULL;
    s->stores = NULL;
    s->nstores = 0;
    st = refit_loader_create(s->cat, &s->cfg, s->mem, s->tp_rank, s->role_rank, s->plan,
                             &s->loader);
    if (st == REFIT_OK) {
      s->loader->run_id = s->run_id;
      s->stores = s->loader->stores;
      s->nstores = s->loader->nstores;
      s->nregistered = 0;
      s->replaying = 1;
      for (int64_t i = 0; i < s->nregs && st == REFIT_OK; i++) {
        refit_tensor_t t = s->regs[i].t;
        t.name = s->regs[i].name;
        st = refit_session_register(s, &t);
      }
      s->replaying = 0;
    }
  }
  REFIT_CHECK(refit_session_agree(s, st, "checking the engine's registrations"));
  REFIT_CHECK(refit_session_agree(s, refit_session_alloc_buffers(s), "allocating memory"));
  return refit_session_register_staging(s, REFIT_OK);
}

/* First begin, before anything is bound: every rank's registration forms
 * decide which runtime tensors are MXFP8 (precision.h; collective). */
static refit_status_t refit_session_settle_precision(refit_session_t *s) {
  const int64_t n = s->cat->gen_begin[s->cat->generator.tp];
  unsigned char *mine = s->form_votes, *all = s->form_votes + n + 1;
  memset(mine, 0, (size_t)(2 * n + 2));
  for (int64_t i = 0; i < s->nregs; i++)
    mine[s->regs[i].gen] |= (unsigned char)s->regs[i].form;
  MPI_Request req;
  REFIT_CHECK(refit_session_startup_wait(
      s, &req,
      MPI_Iallreduce(mine, all, (int)n, MPI_UNSIGNED_CHAR, MPI_BOR, s->world, &req),
      "first begin: the engines' registered precisions"));
  int64_t to_bf16 = 0, to_mxfp8 = 0;
  REFIT_CHECK(refit_precision_decide(&s->cfg, s->cat, all, &to_bf16, &to_mxfp8));
  if (to_bf16 == 0 && to_mxfp8 == 0)
    return REFIT_OK;
  if (s->rank == 0)
    REFIT_INFO("the engine registers %lld runtime tensor%s in bfloat16 and %lld in MXFP8 "
               "where the config said otherwise; refit follows the engine and plans again",
               (long long)to_bf16, to_bf16 == 1 ? "" : "s", (long long)to_mxfp8);
  return refit_session_replan(s);
}

/* First refit: every tensor either registered by the caller or, when the
 * caller registered none, allocated here. A partial registration is an
 * error listing what is missing. */
static refit_status_t refit_session_bind(refit_session_t *s) {
  char missing[1024] = "";
  size_t used = 0;
  int64_t nmissing = 0;
  /* Caller-owned weights must be the caller's: refit allocating them would
   * send zeros. */
  const int caller = s->is_trainer && s->cfg.source.kind == REFIT_SOURCE_CALLER;
  if (s->nregistered > 0 || caller) {
    if (s->is_trainer) {
      for (int64_t i = 0; i < s->cat->nsrc; i++)
        if (s->shard_part[i] >= 0 && s->shards[i] == NULL && nmissing++ < 8 &&
            used < sizeof(missing))
          used += (size_t)snprintf(missing + used, sizeof(missing) - used, "%s%s",
                                   used ? ", " : "", s->cat->src[i].name);
    } else {
      for (int64_t i = 0; i < s->nstores; i++)
        if (s->stores[i].data == NULL && nmissing++ < 8 && used < sizeof(missing))
          used += (size_t)snprintf(missing + used, sizeof(missing) - used, "%s%s",
                                   used ? ", " : "", s->stores[i].name);
    }
    if (nmissing > 0)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "%s rank %d: %lld tensor%s not registered%s: %s%s",
                       s->is_trainer ? "trainer" : "generator", s->role_rank,
                       (long long)nmissing, nmissing == 1 ? "" : "s",
                       caller ? " (source.kind caller: the trainer registers "
                                "every tensor it holds)"
                              : "",
                       missing, nmissing > 8 ? ", ..." : "");
  }
  if (s->is_trainer) {
    for (int64_t i = 0; i < s->cat->nsrc; i++) {
      if (s->shard_part[i] < 0 || s->shards[i] != NULL)
        continue;
      int64_t rows, cols;
      refit_src_shard_shape(&s->cat->src[i], &rows, &cols);
      REFIT_CHECK(refit_mem_alloc(s->mem, (size_t)(rows * cols) * sizeof(uint16_t),
                                  (void **)&s->shards[i]));
      s->shard_owned[i] = 1;
    }
    REFIT_CHECK(refit_trainer_tables(s));
  } else {
    REFIT_CHECK(refit_loader_allocate(s->loader));
  }
  s->bound = 1;
  return REFIT_OK;
}

/* Wait for a request on the control communicator until the deadline. */
static refit_status_t refit_session_ctrl_wait(refit_session_t *s, MPI_Request *req,
                                              double deadline, const char *phase) {
  return refit_session_join_wait(s, req, deadline, phase, "refit.timeout_s",
                                 s->cfg.refit.timeout_s);
}

/* Does the fault seam fire on this rank, in this phase, this refit? */
static int refit_session_fault_here(const refit_session_t *s, int phase) {
  const refit_fault_t *f = &s->fault;
  if (!f->enabled || f->phase != phase || f->rank != s->rank)
    return 0;
  if (f->refit != 0 && (uint64_t)f->refit != s->attempt)
    return 0;
  if (f->probability < 1.0) {
    uint64_t h = refit_hash_u64(refit_hash_u64(REFIT_HASH_INIT, s->cfg.source.seed),
                                s->attempt);
    if ((double)(h >> 11) / (double)(UINT64_C(1) << 53) >= f->probability)
      return 0;
  }
  return 1;
}

/* Faults that act the same in every phase: die, stall, or fail. Returns the
 * injected error, or REFIT_OK for the data faults the caller applies. */
static refit_status_t refit_session_fault_act(refit_session_t *s,
                                              const char *where) {
  switch (s->fault.action) {
  case REFIT_FAULT_KILL:
    REFIT_WARN("fault seam: killing rank %d at %s", s->rank, where);
    raise(SIGKILL);
    break;
  case REFIT_FAULT_EXIT:
    REFIT_WARN("fault seam: rank %d exits at %s", s->rank, where);
    _exit(7);
  case REFIT_FAULT_STALL: {
    REFIT_WARN("fault seam: rank %d stalls at %s", s->rank, where);
    struct timespec ts = {(time_t)(s->cfg.refit.timeout_s * 1.5) + 1, 0};
    nanosleep(&ts, NULL);
    return REFIT_ERR(REFIT_ERR_TIMEOUT, "fault seam: rank %d stalled at %s",
                     s->rank, where);
  }
  case REFIT_FAULT_ERROR:
    return REFIT_ERR(REFIT_ERR_INTERNAL, "fault seam: injected error at %s on rank %d",
                     where, s->rank);
  default:
    break;
  }
  return REFIT_OK;
}


/* After a failed refit left some rank's transport unusable, every rank
 * (known alive from the header exchange just done) repairs it together,
 * then agrees on the outcome by the deadline. A transport that cannot be
 * repaired ends the session. */
static refit_status_t refit_session_recover_transport(refit_session_t *s,
                                                      int unhealthy_rank,
                                                      double deadline) {
  const refit_transport_ops_t *ops = s->transport.ops;
  refit_status_t st;
  if (ops->recover == NULL) {
    s->broken = 1;
    return REFIT_ERR(REFIT_ERR_PEER,
                     "begin: the %s transport of rank %d is unusable after the "
                     "failed refit and cannot be repaired; restart the job",
                     ops->name, unhealthy_rank);
  }
  REFIT_WARN("begin: repairing the %s transport on every rank (rank %d's "
             "failed in the last refit)",
             ops->name, unhealthy_rank);
  st = ops->recover(s->transport.ctx, deadline);
  int ok = st == REFIT_OK, all_ok = 0;
  MPI_Request req;
  MPI_Iallreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, s->ctrl, &req);
  REFIT_CHECK(refit_session_ctrl_wait(s, &req, deadline, "begin: transport repair"));
  if (st != REFIT_OK || !all_ok) {
    s->broken = 1;
    return st != REFIT_OK ? st
                          : REFIT_ERR(REFIT_ERR_PEER,
                                      "begin: another rank could not repair the %s "
                                      "transport; restart the job",
                                      ops->name);
  }
  return REFIT_OK;
}

refit_status_t refit_session_begin(refit_session_t *s, uint64_t version, void *stream) {
  refit_status_t st;
  if (s->broken)
    return REFIT_ERR(REFIT_ERR_PEER, "begin %llu: an earlier collective timed out; "
                     "the session cannot continue (restart the job)",
                     (unsigned long long)version);
  if (s->state != REFIT_STATE_IDLE && s->state != REFIT_STATE_POISONED)
    return REFIT_ERR(REFIT_ERR_STATE, "begin %llu: a refit is already in progress "
                     "(state %d); commit or abort it first",
                     (unsigned long long)version, (int)s->state);
  const double t_acquire = MPI_Wtime();
  /* Every rank's first begin, whether or not its memory is complete: the
   * engines' forms are reduced once (collective). A failure after planning
   * again leaves nothing consistent to refit with. */
  st = REFIT_OK;
  if (!s->precision_settled) {
    s->precision_settled = 1;
    st = refit_session_settle_precision(s);
    if (st != REFIT_OK && st != REFIT_ERR_INVALID_ARGUMENT)
      s->broken = 1;
    if (st != REFIT_OK)
      return st;
  }
  if (!s->bound)
    st = refit_session_bind(s);
  else
    st = refit_session_acquire_staging(s);
  if (st == REFIT_OK && s->moved)
    st = refit_trainer_repoint(s);
  /* Nothing refit does on the device starts before the caller's work
   * queued on `stream` so far: a trainer's last optimizer step, an engine's
   * last forward over the storage a sync refit overwrites. */
  if (st == REFIT_OK)
    st = refit_mem_after_stream(s->mem, stream);
  const double acquire_s = MPI_Wtime() - t_acquire;

  /* Everyone's (run id, version, plan hash, committed version) before a
   * byte moves. */
  const int transport_ok = s->transport.ops->healthy == NULL ||
                           s->transport.ops->healthy(s->transport.ctx);
  /* The exchange's buffers live in the session: a collective that misses
   * its deadline stays with MPI, which may still write them later. */
  refit_header_t *mine = s->header_buf, *all = s->header_buf + 1;
  *mine = (refit_header_t){s->run_id, version,      s->plan->hash, s->committed,
                           s->is_trainer ? 0 : 1,   st == REFIT_OK, transport_ok,
                           0};
  MPI_Request req;
  const double deadline = MPI_Wtime() + s->cfg.refit.timeout_s;
  MPI_Iallgather(mine, (int)sizeof(*mine), MPI_BYTE, all, (int)sizeof(*mine),
                 MPI_BYTE, s->ctrl, &req);
  refit_status_t wst = refit_session_ctrl_wait(s, &req, deadline, "begin: header exchange");
  if (wst != REFIT_OK)
    return wst;
  if (st == REFIT_OK)
    for (int r = 0; r < s->size; r++) {
      const refit_header_t *h = &all[r];
      if (h->run_id != s->run_id || h->plan_hash != s->plan->hash) {
        st = REFIT_ERR(REFIT_ERR_STATE,
                       "begin %llu: rank %d has run id %016llx / plan hash "
                       "%016llx, rank %d has %016llx / %016llx",
                       (unsigned long long)version, r,
                       (unsigned long long)h->run_id,
                       (unsigned long long)h->plan_hash, s->rank,
                       (unsigned long long)s->run_id,
                       (unsigned long long)s->plan->hash);
        break;
      }
      if (!h->ok) {
        st = REFIT_ERR(REFIT_ERR_PEER,
                       "begin %llu: rank %d could not start (its error is in "
                       "its log)",
                       (unsigned long long)version, r);
        break;
      }
      if (h->version != version) {
        st = REFIT_ERR(REFIT_ERR_STATE,
                       "begin %llu: rank %d asks for version %llu instead",
                       (unsigned long long)version, r,
                       (unsigned long long)h->version);
        break;
      }
      if (h->side == 1 && version <= h->committed) {
        st = REFIT_ERR(REFIT_ERR_STATE,
                       "begin %llu: refused: generator rank %d already holds "
                       "version %llu (versions must increase; a stale or "
                       "replayed version)",
                       (unsigned long long)version, r - s->ntrainer,
                       (unsigned long long)h->committed);
        break;
      }
    }
  int unhealthy = -1;
  for (int r = 0; r < s->size && unhealthy < 0; r++)
    if (!all[r].transport_ok)
      unhealthy = r;
  if (st != REFIT_OK)
    return st;
  if (unhealthy >= 0)
    REFIT_CHECK(refit_session_recover_transport(s, unhealthy, deadline));

  s->attempt++;
  s->vote_pending = 1;
  s->peer_lost = 0;
  s->failure[0] = '\0';
  s->poisoned_before = s->state == REFIT_STATE_POISONED;
  s->pending = version;
  s->next_bucket = 0;
  s->next_posted = 0;
  memset(&s->times, 0, sizeof(s->times));
  s->times.staging = acquire_s;
  s->t_begin = MPI_Wtime() - acquire_s;
  s->deadline = s->t_begin + s->cfg.refit.timeout_s;
  /* Tags name the attempt as far as MPI_TAG_UB allows (Open MPI: 2^31 - 1,
   * so 32768 attempts; the standard's minimum 32767, 8): a message of a
   * failed refit never matches a later one's receive by its tag (transports
   * that can also start clean after a failure, as MPI's, do). */
  s->tag_base = (int)((s->attempt & s->attempt_mask) << 12);
  s->state = REFIT_STATE_RECEIVING;
  if (s->is_trainer) {
    double t = MPI_Wtime();
    if (s->cfg.source.kind != REFIT_SOURCE_CALLER)
      st = refit_trainer_source(s, version);
    s->times.source = MPI_Wtime() - t;
  } else {
    refit_loader_begin(s->loader);
  }
  if (st != REFIT_OK) {
    refit_session_abort(s);
    return st;
  }
  return REFIT_OK;
}

/* The bucket at which a transfer-phase fault fires. */
static int32_t refit_session_fault_bucket(const refit_session_t *s) {
  int32_t b = (int32_t)(s->fault.at * s->plan->nbuckets);
  if (b >= s->plan->nbuckets)
    b = s->plan->nbuckets - 1;
  return b < 0 ? 0 : b;
}

static refit_status_t refit_session_wait_slot(refit_session_t *s, int slot,
                                              const char *what, int32_t bucket) {
  char phase[128];
  if (s->inflight[slot] == NULL)
    return REFIT_OK;
  snprintf(phase, sizeof(phase), "version %llu bucket %d %s on %s rank %d",
           (unsigned long long)s->pending, bucket, what,
           s->is_trainer ? "trainer" : "generator", s->role_rank);
  double t = MPI_Wtime();
  refit_status_t st = s->transport.ops->wait(s->transport.ctx, s->inflight[slot],
                                             s->deadline, phase);
  s->inflight[slot] = NULL;
  s->times.transfer += MPI_Wtime() - t;
  if (st == REFIT_ERR_TIMEOUT)
    s->peer_lost = 1;
  if (st == REFIT_OK) /* a deadline of progress: timeout_s from the last bucket */
    s->deadline = MPI_Wtime() + s->cfg.refit.timeout_s;
  return st;
}

/* Advance the exchange in `slot` without blocking: *arrived = 1 once it
 * completed (then the slot is free). Transports without a test op complete
 * it with a blocking wait. */
static refit_status_t refit_session_poll_slot(refit_session_t *s, int slot,
                                              int *arrived) {
  *arrived = 1;
  if (s->inflight[slot] == NULL)
    return REFIT_OK;
  if (s->transport.ops->test == NULL)
    return refit_session_wait_slot(s, slot, "poll", -1);
  double t = MPI_Wtime();
  refit_status_t st = s->transport.ops->test(s->transport.ctx, s->inflight[slot],
                                             arrived);
  s->times.transfer += MPI_Wtime() - t;
  if (st != REFIT_OK || *arrived)
    s->inflight[slot] = NULL; /* freed by test */
  if (st == REFIT_OK && *arrived)
    s->deadline = MPI_Wtime() + s->cfg.refit.timeout_s;
  return st;
}

/* Trainer: one bucket (pack and send), or the final drain. */
static refit_status_t refit_session_step_trainer(refit_session_t *s, int *done) {
  const refit_plan_t *p = s->plan;
  const int32_t b = s->next_bucket;
  refit_status_t st;
  if (b >= p->nbuckets) {
    for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++)
      REFIT_CHECK(refit_session_wait_slot(s, i, "send", b));
    *done = 1;
    return REFIT_OK;
  }
  const int slot = b % REFIT_EXCHANGES_IN_FLIGHT;
  REFIT_CHECK(refit_session_wait_slot(s, slot, "send", b - REFIT_EXCHANGES_IN_FLIGHT));
  int nx = 0;
  double t = MPI_Wtime();
  st = refit_trainer_pack(s, b, s->buffer[slot], s->xfers, &nx, 0);
  /* While the pack kernel runs, keep the bucket in flight moving: some
   * transports (CUDA IPC) only advance when called. */
  for (int packed = 0; st == REFIT_OK && !packed;) {
    st = refit_mem_done(s->mem, &packed);
    const int other = (slot + 1) % REFIT_EXCHANGES_IN_FLIGHT;
    int sent = 1;
    if (st == REFIT_OK && !packed && s->inflight[other] != NULL &&
        s->transport.ops->test != NULL)
      st = refit_session_poll_slot(s, other, &sent);
  }
  s->times.pack += MPI_Wtime() - t;
  REFIT_CHECK(st);
  if (nx > 0 && refit_session_fault_here(s, REFIT_FAULT_PHASE_TRANSFER) &&
      b == refit_session_fault_bucket(s)) {
    REFIT_CHECK(refit_session_fault_act(s, "transfer"));
    if (s->fault.action == REFIT_FAULT_BITFLIP) {
      unsigned char *at = (unsigned char *)s->xfers[0].buf + s->xfers[0].bytes / 2;
      unsigned char byte;
      REFIT_CHECK(refit_mem_to_host(s->mem, &byte, at, 1));
      byte ^= 0x04;
      REFIT_CHECK(refit_mem_from_host(s->mem, at, &byte, 1));
      REFIT_WARN("fault seam: flipped a bit of bucket %d to rank %d", b,
                 s->xfers[0].peer);
    } else if (s->fault.action == REFIT_FAULT_TRUNCATE) {
      s->xfers[0].bytes -= 1;
      REFIT_WARN("fault seam: truncated bucket %d to rank %d", b, s->xfers[0].peer);
    } else if (s->fault.action == REFIT_FAULT_DROP) {
      REFIT_WARN("fault seam: dropped bucket %d to rank %d", b, s->xfers[0].peer);
      s->xfers[0] = s->xfers[--nx];
    } else if (s->fault.action == REFIT_FAULT_STALE && s->pending > 1 && s->attempt > 1) {
      /* The bytes of this refit, sealed as the previous refit's: what a
       * message of that refit left in a queue would look like. */
      REFIT_CHECK(refit_mem_pack(s->mem, &s->pack, s->pack_begin[b],
                                 s->pack_begin[b + 1] - s->pack_begin[b],
                                 refit_seal_tag(s->pending - 1, s->attempt - 1),
                                 s->buffer[slot]));
      REFIT_CHECK(refit_mem_sync(s->mem));
      REFIT_WARN("fault seam: bucket %d sealed as the refit of version %llu", b,
                 (unsigned long long)(s->pending - 1));
    }
  }
  REFIT_CHECK(s->transport.ops->start(s->transport.ctx, s->xfers, nx, NULL, 0,
                                      s->tag_base | (b & 0xfff), &s->inflight[slot]));
  s->next_posted = b + 1;
  s->next_bucket++;
  *done = 0;
  return REFIT_OK;
}

/* Generator: post bucket b+1, wait for bucket b, land it. */
static refit_status_t refit_session_step_generator(refit_session_t *s, int *done) {
  const refit_plan_t *p = s->plan;
  const int32_t b = s->next_bucket;
  int nx = 0;
  if (b == 0 && p->nbuckets > 0 && s->next_posted == 0) {
    refit_generator_recvs(s, 0, s->buffer[0], s->xfers, &nx);
    REFIT_CHECK(s->transport.ops->start(s->transport.ctx, NULL, 0, s->xfers, nx,
                                        s->tag_base, &s->inflight[0]));
    s->next_posted = 1;
  }
  if (b >= p->nbuckets) {
    double t = MPI_Wtime();
    refit_status_t st = refit_loader_end(s->loader);
    s->times.unpack += MPI_Wtime() - t;
    REFIT_CHECK(st);
    *done = 1;
    return REFIT_OK;
  }
  if (b + 1 < p->nbuckets && s->next_posted <= b + 1) {
    const int next = (b + 1) % REFIT_EXCHANGES_IN_FLIGHT;
    refit_generator_recvs(s, b + 1, s->buffer[next], s->xfers, &nx);
    REFIT_CHECK(s->transport.ops->start(s->transport.ctx, NULL, 0, s->xfers, nx,
                                        s->tag_base | ((b + 1) & 0xfff),
                                        &s->inflight[next]));
    s->next_posted = b + 2;
  }
  const int slot = b % REFIT_EXCHANGES_IN_FLIGHT;
  if (refit_session_fault_here(s, REFIT_FAULT_PHASE_TRANSFER) &&
      b == refit_session_fault_bucket(s))
    REFIT_CHECK(refit_session_fault_act(s, "transfer"));
  if (s->cfg.refit.mode == REFIT_MODE_ASYNC && MPI_Wtime() < s->deadline) {
    /* Async: the engine serves between progress calls, so a bucket still in
     * flight returns at once instead of blocking it. */
    int arrived = 0;
    REFIT_CHECK(refit_session_poll_slot(s, slot, &arrived));
    if (!arrived) {
      *done = 0;
      return REFIT_OK;
    }
  }
  REFIT_CHECK(refit_session_wait_slot(s, slot, "receive", b));
  refit_land_fault_t lf = REFIT_LAND_NORMAL;
  if (refit_session_fault_here(s, REFIT_FAULT_PHASE_QUANTIZE) &&
      b == refit_session_fault_bucket(s)) {
    REFIT_CHECK(refit_session_fault_act(s, "quantize"));
    lf = s->fault.action == REFIT_FAULT_DROP        ? REFIT_LAND_DROP_ONE
         : s->fault.action == REFIT_FAULT_DUPLICATE ? REFIT_LAND_DUPLICATE_ONE
         : s->fault.action == REFIT_FAULT_BITFLIP   ? REFIT_LAND_FLIP_ONE
                                                    : REFIT_LAND_NORMAL;
  }
  double t = MPI_Wtime();
  refit_status_t st = refit_loader_land_bucket(s->loader, b, s->buffer[slot],
                                               refit_seal_tag(s->pending, s->attempt), lf);
  s->times.unpack += MPI_Wtime() - t;
  REFIT_CHECK(st);
  s->next_bucket++;
  *done = 0;
  return REFIT_OK;
}

refit_status_t refit_session_progress(refit_session_t *s, int *done) {
  *done = 0;
  if (s->state == REFIT_STATE_READY) {
    *done = 1;
    return REFIT_OK;
  }
  if (s->state != REFIT_STATE_RECEIVING)
    return REFIT_ERR(REFIT_ERR_STATE, "progress: no refit in progress (state %d)",
                     (int)s->state);
  refit_status_t st = s->is_trainer ? refit_session_step_trainer(s, done)
                                    : refit_session_step_generator(s, done);
  if (st != REFIT_OK) {
    /* Keep the first failure's message: the drain in abort may fail again
     * (a transport refusing work after the first failure), and the vote
     * should name the cause, not the echo. */
    if (s->failure[0] == '\0')
      snprintf(s->failure, sizeof(s->failure), "%s", refit_last_error());
    refit_session_abort(s);
    return st;
  }
  if (*done)
    s->state = REFIT_STATE_READY;
  return REFIT_OK;
}

refit_status_t refit_session_commit(refit_session_t *s, void *stream) {
  refit_status_t st = REFIT_OK;
  /* The vote's buffers live in the session (see begin's headers). */
  int *const vote = s->vote_buf, *const votes = s->vote_buf + 1;
  int ok = s->state == REFIT_STATE_READY;
  if (s->broken)
    return REFIT_ERR(REFIT_ERR_PEER, "commit: the session cannot continue after "
                     "an earlier timeout (restart the job)");
  if (!s->vote_pending)
    return REFIT_ERR(REFIT_ERR_STATE, "commit: no refit to commit (none begun, "
                     "or its vote already happened)");
  if (refit_session_fault_here(s, REFIT_FAULT_PHASE_COMMIT)) {
    st = refit_session_fault_act(s, "commit");
    ok = ok && st == REFIT_OK;
  }
  /* A rank that failed earlier still votes (no), so that nobody waits for
   * it and nobody commits. */
  if (ok)
    s->state = REFIT_STATE_COMMITTING;
  MPI_Request req;
  const double t = MPI_Wtime();
  if (refit_session_fault_here(s, REFIT_FAULT_PHASE_VOTE) &&
      s->fault.action == REFIT_FAULT_STALL) {
    /* Held at the vote until every peer's vote deadline has passed, then
     * it votes: nobody can know the outcome. */
    REFIT_WARN("fault seam: rank %d stalls inside the commit vote", s->rank);
    struct timespec ts = {(time_t)(2 * s->cfg.refit.timeout_s) + 1, 0};
    nanosleep(&ts, NULL);
  }
  *vote = ok;
  MPI_Iallgather(vote, 1, MPI_INT, votes, 1, MPI_INT, s->ctrl, &req);
  /* A live peer may still be waiting out this refit's deadline (a message
   * that never came) before it votes: a rank that got here early waits for
   * that deadline plus the timeout, so only a dead or stalled peer misses
   * the vote. */
  const double vote_deadline =
      (MPI_Wtime() > s->deadline ? MPI_Wtime() : s->deadline) + s->cfg.refit.timeout_s;
  refit_status_t wst = refit_session_ctrl_wait(s, &req, vote_deadline, "commit: vote");
  s->vote_pending = 0;
  if (wst != REFIT_OK && !ok) {
    /* This rank voted no: nobody can have committed, whatever became of
     * the vote elsewhere. Keep or restore version V (below). */
    if (st == REFIT_OK)
      st = wst;
  } else if (wst != REFIT_OK) {
    /* This rank voted yes and cannot learn the outcome: peers whose vote
     * completed may have committed the new version, others may not have.
     * Guessing either way could leave the ranks of one engine on different
     * versions, so a generator refuses to serve (POISONED) until a full
     * successful refit; the session is broken (a collective never
     * completed), so that means a restart. */
    char why[512];
    snprintf(why, sizeof(why), "%s", refit_last_error());
    s->state = s->is_trainer ? REFIT_STATE_IDLE : REFIT_STATE_POISONED;
    return REFIT_ERR(wst,
                     "commit of version %llu: the vote did not complete on %s "
                     "rank %d (%s); its outcome is unknown here (peers may have "
                     "committed)%s",
                     (unsigned long long)s->pending, s->is_trainer ? "trainer" : "generator",
                     s->role_rank, why,
                     s->is_trainer ? "" : ": POISONED, refusing to serve until a "
                                          "full successful refit (restart the job)");
  } else if (ok) {
    int first_no = -1, nno = 0;
    for (int r = 0; r < s->size; r++)
      if (!votes[r]) {
        if (first_no < 0)
          first_no = r;
        nno++;
      }
    if (nno > 0)
      st = REFIT_ERR(REFIT_ERR_PEER,
                     "commit of version %llu refused: %d rank%s did not complete "
                     "(first: world rank %d); version %llu stays",
                     (unsigned long long)s->pending, nno, nno == 1 ? "" : "s",
                     first_no, (unsigned long long)s->committed);
  } else if (st == REFIT_OK) {
    /* This rank failed earlier: name that failure. */
    char why[512];
    snprintf(why, sizeof(why), "%s", s->failure[0] ? s->failure : refit_last_error());
    st = REFIT_ERR(REFIT_ERR_STATE,
                   "commit of version %llu refused: this rank failed: %s; "
                   "version %llu stays",
                   (unsigned long long)s->pending, why,
                   (unsigned long long)s->committed);
  }
  if (st != REFIT_OK) {
    if (s->state == REFIT_STATE_COMMITTING)
      s->state = REFIT_STATE_READY;
    refit_session_abort(s);
    return st;
  }
  if (!s->is_trainer) {
    st = refit_loader_commit(s->loader);
    if (st != REFIT_OK) {
      /* The vote passed but the shadow copy failed: storage may be mixed. */
      s->state = REFIT_STATE_POISONED;
      return st;
    }
  }
  /* The engine's work queued on `stream` from now on reads the new
   * version (the async shadow copy above is on refit's stream). */
  if (!s->is_trainer && (st = refit_mem_before_stream(s->mem, stream)) != REFIT_OK) {
    s->state = REFIT_STATE_POISONED;
    return st;
  }
  s->times.commit = MPI_Wtime() - t;
  s->committed = s->pending;
  s->poisoned_before = 0;
  s->state = REFIT_STATE_IDLE;
  const double t_release = MPI_Wtime();
  refit_session_release_staging(s);
  s->times.staging += MPI_Wtime() - t_release;
  s->times.total = MPI_Wtime() - s->t_begin;
  return REFIT_OK;
}

/* After a local failure mid-refit, finish this rank's part of the bucket
 * schedule without landing anything (generators receive and discard, trainers
 * keep sending), so that healthy peers reach the vote instead of waiting for
 * the deadline. Skipped when a peer is already known lost. */
static void refit_session_drain(refit_session_t *s) {
  const refit_plan_t *p = s->plan;
  for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++)
    if (refit_session_wait_slot(s, i, "drain", -1) != REFIT_OK)
      return;
  for (int32_t b = s->next_posted; b < p->nbuckets && !s->peer_lost; b++) {
    int nx = 0;
    refit_exchange_t *ex = NULL;
    if (s->is_trainer) {
      if (refit_trainer_pack(s, b, s->buffer[0], s->xfers, &nx, 1) != REFIT_OK)
        return;
      if (s->transport.ops->start(s->transport.ctx, s->xfers, nx, NULL, 0,
                                  s->tag_base | (b & 0xfff), &ex) != REFIT_OK)
        return;
    } else {
      refit_generator_recvs(s, b, s->buffer[0], s->xfers, &nx);
      if (s->transport.ops->start(s->transport.ctx, NULL, 0, s->xfers, nx,
                                  s->tag_base | (b & 0xfff), &ex) != REFIT_OK)
        return;
    }
    s->inflight[0] = ex;
    if (refit_session_wait_slot(s, 0, "drain", b) != REFIT_OK)
      return;
  }
}

refit_status_t refit_session_abort(refit_session_t *s) {
  if (s->state == REFIT_STATE_IDLE || s->state == REFIT_STATE_POISONED)
    return REFIT_OK;
  if (s->state == REFIT_STATE_RECEIVING && !s->peer_lost && !s->broken)
    refit_session_drain(s);
  for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++)
    if (s->inflight[i] != NULL) {
      if (s->transport.ops->abandon != NULL)
        s->transport.ops->abandon(s->transport.ctx, s->inflight[i]);
      else /* no way to cancel: wait out what is left, ignoring failures */
        (void)s->transport.ops->wait(s->transport.ctx, s->inflight[i],
                                     MPI_Wtime(), "abort");
      s->inflight[i] = NULL;
    }
  if (!s->is_trainer && !refit_loader_rollback(s->loader)) {
    REFIT_WARN("generator rank %d: refit of version %llu failed after runtime "
               "storage was written and refit.restore is none: POISONED until "
               "a full successful refit",
               s->role_rank, (unsigned long long)s->pending);
    s->state = REFIT_STATE_POISONED;
    return REFIT_OK;
  }
  s->state = s->poisoned_before ? REFIT_STATE_POISONED : REFIT_STATE_IDLE;
  if (!s->vote_pending && !s->peer_lost)
    refit_session_release_staging(s);
  return REFIT_OK;
}

refit_status_t refit_session_verify(refit_session_t *s, uint64_t version,
                                    int64_t *mismatches) {
  *mismatches = 0;
  if (s->is_trainer)
    return REFIT_OK;
  if (refit_session_fault_here(s, REFIT_FAULT_PHASE_VERIFY) && s->nstores > 0 &&
      s->fault.action == REFIT_FAULT_BITFLIP) {
    unsigned char *at = (unsigned char *)s->stores[0].data + s->stores[0].bytes / 2;
    unsigned char byte;
    REFIT_CHECK(refit_mem_to_host(s->mem, &byte, at, 1));
    byte ^= 0x01;
    REFIT_CHECK(refit_mem_from_host(s->mem, at, &byte, 1));
    REFIT_WARN("fault seam: flipped a bit of runtime %s before verification",
               s->stores[0].name);
  }
  return refit_loader_verify(s->loader, &s->source, version, mismatches);
}

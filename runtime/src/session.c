#include "session.h"

#include "core/hash.h"
#include "core/log.h"
#include "reshard/reference.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every rank learns whether any rank failed `phase`; a rank that did not
 * fail itself returns REFIT_ERR_PEER. */
static refit_status_t refit_session_agree(MPI_Comm comm, refit_status_t st,
                                          const char *phase) {
  int mine = st != REFIT_OK, any = 0;
  if (MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, comm) != MPI_SUCCESS)
    return REFIT_ERR(REFIT_ERR_MPI, "%s: MPI_Allreduce failed", phase);
  if (st != REFIT_OK)
    return st;
  if (any)
    return REFIT_ERR(REFIT_ERR_PEER, "%s failed on another rank", phase);
  return REFIT_OK;
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
  REFIT_CHECK(refit_session_agree(s->world, st, "reading the config"));
  MPI_Bcast(&len, 1, MPI_UNSIGNED_LONG_LONG, 0, s->world);
  if (s->rank != 0) {
    s->config_text = malloc(len + 1);
    if (s->config_text == NULL)
      st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "config text of %llu bytes", len);
    else
      s->config_text[len] = '\0';
    s->config_len = len;
  }
  REFIT_CHECK(refit_session_agree(s->world, st, "receiving the config"));
  MPI_Bcast(s->config_text, (int)len, MPI_CHAR, 0, s->world);
  MPI_Bcast(&s->cfg, (int)sizeof(s->cfg), MPI_BYTE, 0, s->world);

  /* Prove every rank holds the same config with the same binary layout. */
  uint64_t h = refit_hash_bytes(REFIT_HASH_INIT, s->config_text, len);
  h = refit_hash_bytes(h, &s->cfg, sizeof(s->cfg));
  uint64_t lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, s->world);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, s->world);
  if (lo != hi)
    return REFIT_ERR(REFIT_ERR_CONFIG,
                     "config hash differs between ranks (%016llx on rank %d): "
                     "are all ranks running the same refit build?",
                     (unsigned long long)h, s->rank);
  return REFIT_OK;
}

static refit_status_t refit_session_plan(refit_session_t *s) {
  refit_plan_options_t opt = {.bucket_bytes = s->cfg.refit.bucket_bytes,
                              .wire = REFIT_WIRE_BF16};
  refit_status_t st = refit_catalog_create(&s->cfg.model, &s->cfg.trainer,
                                           &s->cfg.generator, &s->cat);
  if (st == REFIT_OK)
    st = refit_plan_create(s->cat, &opt, &s->plan);
  REFIT_CHECK(refit_session_agree(s->world, st, "planning"));

  uint64_t lo = 0, hi = 0, h = s->plan->hash;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, s->world);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, s->world);
  if (lo != hi)
    return REFIT_ERR(REFIT_ERR_INTERNAL,
                     "plan hash differs between ranks (%016llx on rank %d)",
                     (unsigned long long)h, s->rank);

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

static refit_status_t refit_session_alloc_trainer(refit_session_t *s) {
  const refit_catalog_t *cat = s->cat;
  int64_t send_max = 0;
  s->shards = calloc((size_t)cat->nsrc, sizeof(*s->shards));
  s->shard_part = calloc((size_t)cat->nsrc, sizeof(*s->shard_part));
  if (s->shards == NULL || s->shard_part == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "shard table");
  for (int64_t i = 0; i < cat->nsrc; i++) {
    const refit_src_tensor_t *t = &cat->src[i];
    for (int32_t p = 0; p < t->nparts && s->shards[i] == NULL; p++)
      for (int32_t r = 0; r < t->nreplicas; r++) {
        if (refit_src_holder(cat, t, p, r) != s->role_rank)
          continue;
        int64_t rows, cols;
        refit_src_shard_shape(t, &rows, &cols);
        s->shards[i] = malloc((size_t)(rows * cols) * sizeof(uint16_t));
        if (s->shards[i] == NULL)
          return REFIT_ERR(REFIT_ERR_NO_MEMORY,
                           "trainer rank %d: shard of %s (%lld x %lld)",
                           s->role_rank, t->name, (long long)rows,
                           (long long)cols);
        s->shard_part[i] = p;
        break;
      }
  }
  for (int32_t b = 0; b < s->plan->nbuckets; b++) {
    int64_t bytes = 0;
    for (int64_t k = s->my_begin[b]; k < s->my_begin[b + 1]; k++)
      bytes += s->plan->msgs[s->my_msgs[k]].bytes;
    if (bytes > send_max)
      send_max = bytes;
  }
  for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++) {
    s->sendbuf[i] = malloc((size_t)(send_max ? send_max : 1));
    if (s->sendbuf[i] == NULL)
      return REFIT_ERR(REFIT_ERR_NO_MEMORY, "send buffer of %lld bytes",
                       (long long)send_max);
  }
  return REFIT_OK;
}

static refit_status_t refit_session_alloc_generator(refit_session_t *s) {
  const refit_catalog_t *cat = s->cat;
  const int64_t first = cat->gen_begin[s->tp_rank];
  s->nruntime = cat->gen_begin[s->tp_rank + 1] - first;
  s->stores = calloc((size_t)(2 * s->nruntime), sizeof(*s->stores));
  s->store_of = calloc((size_t)s->nruntime, sizeof(*s->store_of));
  if (s->stores == NULL || s->store_of == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "runtime tensor table");
  for (int64_t i = 0; i < s->nruntime; i++) {
    const refit_gen_tensor_t *g = &cat->gen[first + i];
    refit_store_t *st = &s->stores[s->nstores];
    s->store_of[i] = s->nstores++;
    snprintf(st->name, sizeof(st->name), "%s", g->name);
    st->dtype = REFIT_DTYPE_BF16;
    st->layout = "linear";
    st->ndim = g->ndim;
    memcpy(st->shape, g->shape, sizeof(st->shape));
    st->gen = first + i;
    st->bytes = (size_t)(g->rows * g->cols) * sizeof(uint16_t);
    /* calloc: runtime storage starts defined (zero) before the first refit. */
    st->data = calloc(st->bytes, 1);
    if (st->data == NULL)
      return REFIT_ERR(REFIT_ERR_NO_MEMORY, "generator rank %d: runtime %s",
                       s->role_rank, g->name);
  }
  int64_t staging = s->plan->staging[s->role_rank];
  for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++) {
    s->staging[i] = malloc((size_t)(staging ? staging : 1));
    if (s->staging[i] == NULL)
      return REFIT_ERR(REFIT_ERR_NO_MEMORY, "staging of %lld bytes",
                       (long long)staging);
  }
  return REFIT_OK;
}

refit_status_t refit_session_create(MPI_Comm world, const char *config_path,
                                    refit_session_t **out) {
  refit_status_t st;
  refit_session_t *s = calloc(1, sizeof(*s));
  if (s == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "session");
  s->world = world;
  MPI_Comm_rank(world, &s->rank);
  MPI_Comm_size(world, &s->size);
  refit_log_set_rank(s->rank);

  REFIT_CHECK_GOTO(refit_session_config(s, config_path), st, err);
  s->ntrainer = refit_trainer_world(&s->cfg.trainer);
  s->ngenerator = refit_generator_world(&s->cfg.generator);
  s->is_trainer = s->rank < s->ntrainer;
  s->role_rank = s->is_trainer ? s->rank : s->rank - s->ntrainer;
  s->tp_rank = s->is_trainer ? 0 : s->role_rank % s->cfg.generator.tp;
  s->engine = s->is_trainer ? 0 : s->role_rank / s->cfg.generator.tp;
  REFIT_CHECK_GOTO(refit_session_plan(s), st, err);

  refit_transport_args_t args = {.world = world,
                                 .world_rank = s->rank,
                                 .world_size = s->size,
                                 .timeout_s = s->cfg.refit.timeout_s};
  st = refit_transport_open(s->cfg.refit.transport, &args, &s->transport);
  REFIT_CHECK_GOTO(refit_session_agree(world, st, "opening the transport"), st,
                   err);
  st = refit_source_open(&s->cfg, s->cat, &s->source);
  REFIT_CHECK_GOTO(refit_session_agree(world, st, "opening the source"), st, err);
  st = s->is_trainer ? refit_session_alloc_trainer(s)
                     : refit_session_alloc_generator(s);
  REFIT_CHECK_GOTO(refit_session_agree(world, st, "allocating memory"), st, err);
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
      free(s->shards[i]);
  free(s->shards);
  free(s->shard_part);
  for (int64_t i = 0; i < s->nstores; i++)
    free(s->stores[i].data);
  free(s->stores);
  free(s->store_of);
  for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++) {
    free(s->sendbuf[i]);
    free(s->staging[i]);
  }
  free(s->my_msgs);
  free(s->my_begin);
  refit_plan_destroy(s->plan);
  refit_catalog_destroy(s->cat);
  free(s->config_text);
  free(s);
}

/* Trainer: new weights of `version` into every shard this rank holds. */
static refit_status_t refit_trainer_source(refit_session_t *s, uint64_t version) {
  const refit_catalog_t *cat = s->cat;
  for (int64_t i = 0; i < cat->nsrc; i++) {
    if (s->shards[i] == NULL)
      continue;
    const refit_src_tensor_t *t = &cat->src[i];
    int64_t rows, cols;
    refit_src_shard_shape(t, &rows, &cols);
    const int32_t p = s->shard_part[i];
    REFIT_CHECK(s->source.ops->read(
        s->source.ctx, t, version, t->split == REFIT_SPLIT_ROWS ? p * rows : 0,
        t->split == REFIT_SPLIT_COLS ? p * cols : 0, rows, cols, s->shards[i]));
  }
  return REFIT_OK;
}

/* Trainer: gather the chunks of bucket b into buf, one message per peer. */
static void refit_trainer_pack(refit_session_t *s, int32_t b, unsigned char *buf,
                               refit_xfer_t *xfers, int *nxfers) {
  const refit_plan_t *p = s->plan;
  size_t used = 0;
  *nxfers = 0;
  for (int64_t k = s->my_begin[b]; k < s->my_begin[b + 1]; k++) {
    const refit_msg_t *m = &p->msgs[s->my_msgs[k]];
    xfers[*nxfers].peer = s->ntrainer + m->dst_rank;
    xfers[*nxfers].buf = buf + used;
    xfers[*nxfers].bytes = (size_t)m->bytes;
    (*nxfers)++;
    for (int64_t c = m->chunk_begin; c < m->chunk_begin + m->chunk_count; c++) {
      const refit_chunk_t *ch = &p->chunks[c];
      int64_t shard_rows, shard_cols;
      refit_src_shard_shape(&s->cat->src[ch->src_tensor], &shard_rows, &shard_cols);
      const uint16_t *src = s->shards[ch->src_tensor] + ch->src_row * shard_cols +
                            ch->src_col;
      const size_t row_bytes = (size_t)ch->cols * sizeof(uint16_t);
      for (int64_t r = 0; r < ch->rows; r++) {
        memcpy(buf + used, src + r * shard_cols, row_bytes);
        used += row_bytes;
      }
    }
  }
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

/* Generator: scatter bucket b from staging into the runtime tensors. */
static void refit_generator_unpack(refit_session_t *s, int32_t b,
                                   const unsigned char *buf) {
  const refit_plan_t *p = s->plan;
  const int64_t first = s->cat->gen_begin[s->tp_rank];
  for (int64_t k = s->my_begin[b]; k < s->my_begin[b + 1]; k++) {
    const refit_msg_t *m = &p->msgs[s->my_msgs[k]];
    for (int64_t c = m->chunk_begin; c < m->chunk_begin + m->chunk_count; c++) {
      const refit_chunk_t *ch = &p->chunks[c];
      const refit_gen_tensor_t *g = &s->cat->gen[ch->dst_tensor];
      uint16_t *dst =
          (uint16_t *)s->stores[s->store_of[ch->dst_tensor - first]].data +
          ch->dst_row * g->cols + ch->dst_col;
      const unsigned char *src = buf + ch->offset;
      for (int64_t r = 0; r < ch->rows; r++)
        memcpy(dst + r * g->cols, src + r * ch->row_bytes,
               (size_t)ch->row_bytes);
    }
  }
}

refit_status_t refit_session_refit(refit_session_t *s, uint64_t version,
                                   refit_phase_times_t *times) {
  const refit_transport_ops_t *ops = s->transport.ops;
  const refit_plan_t *p = s->plan;
  refit_exchange_t *inflight[REFIT_EXCHANGES_IN_FLIGHT] = {NULL};
  refit_xfer_t *xfers = NULL;
  refit_status_t st = REFIT_OK;
  int nx = 0;
  char phase[96];

  memset(times, 0, sizeof(*times));
  MPI_Barrier(s->world);
  const double t0 = MPI_Wtime();
  const double deadline = t0 + s->cfg.refit.timeout_s;
  int64_t max_msgs = 1;
  for (int32_t b = 0; b < p->nbuckets; b++)
    if (s->my_begin[b + 1] - s->my_begin[b] > max_msgs)
      max_msgs = s->my_begin[b + 1] - s->my_begin[b];
  xfers = malloc((size_t)max_msgs * sizeof(*xfers));
  if (xfers == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "transfer list");
    goto out;
  }

  if (s->is_trainer) {
    double t = MPI_Wtime();
    st = refit_trainer_source(s, version);
    times->source = MPI_Wtime() - t;
    if (st != REFIT_OK)
      goto out;
    for (int32_t b = 0; b < p->nbuckets; b++) {
      const int slot = b % REFIT_EXCHANGES_IN_FLIGHT;
      if (inflight[slot] != NULL) {
        snprintf(phase, sizeof(phase), "version %llu bucket %d send",
                 (unsigned long long)version, b - REFIT_EXCHANGES_IN_FLIGHT);
        t = MPI_Wtime();
        st = ops->wait(s->transport.ctx, inflight[slot], deadline, phase);
        inflight[slot] = NULL;
        times->transfer += MPI_Wtime() - t;
        if (st != REFIT_OK)
          goto out;
      }
      t = MPI_Wtime();
      refit_trainer_pack(s, b, s->sendbuf[slot], xfers, &nx);
      times->pack += MPI_Wtime() - t;
      REFIT_CHECK_GOTO(ops->start(s->transport.ctx, xfers, nx, NULL, 0,
                                  b % 32768, &inflight[slot]),
                       st, out);
    }
  } else {
    double t;
    for (int32_t b = 0; b < p->nbuckets + 1; b++) {
      /* Post bucket b while bucket b - 1 is unpacked. */
      if (b < p->nbuckets) {
        const int slot = b % REFIT_EXCHANGES_IN_FLIGHT;
        refit_generator_recvs(s, b, s->staging[slot], xfers, &nx);
        REFIT_CHECK_GOTO(ops->start(s->transport.ctx, NULL, 0, xfers, nx,
                                    b % 32768, &inflight[slot]),
                         st, out);
      }
      if (b == 0)
        continue;
      const int prev = (b - 1) % REFIT_EXCHANGES_IN_FLIGHT;
      snprintf(phase, sizeof(phase), "version %llu bucket %d receive",
               (unsigned long long)version, b - 1);
      t = MPI_Wtime();
      st = ops->wait(s->transport.ctx, inflight[prev], deadline, phase);
      inflight[prev] = NULL;
      times->transfer += MPI_Wtime() - t;
      if (st != REFIT_OK)
        goto out;
      t = MPI_Wtime();
      refit_generator_unpack(s, b - 1, s->staging[prev]);
      times->unpack += MPI_Wtime() - t;
    }
  }

out:
  for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++)
    if (inflight[i] != NULL) {
      snprintf(phase, sizeof(phase), "version %llu final drain",
               (unsigned long long)version);
      double t = MPI_Wtime();
      refit_status_t w = ops->wait(s->transport.ctx, inflight[i], deadline, phase);
      times->transfer += MPI_Wtime() - t;
      if (st == REFIT_OK)
        st = w;
    }
  free(xfers);
  if (st == REFIT_OK) {
    MPI_Barrier(s->world);
    s->version = version;
  }
  times->total = MPI_Wtime() - t0;
  return st;
}

refit_status_t refit_session_verify(refit_session_t *s, uint64_t version,
                                    int64_t *mismatches) {
  const refit_catalog_t *cat = s->cat;
  const int64_t first = s->is_trainer ? 0 : cat->gen_begin[s->tp_rank];
  int64_t bad = 0, max_cols = 1;
  refit_status_t st = REFIT_OK;

  for (int64_t i = 0; i < s->nruntime; i++)
    if (cat->gen[first + i].cols > max_cols)
      max_cols = cat->gen[first + i].cols;
  uint16_t *want = malloc((size_t)max_cols * sizeof(uint16_t));
  if (want == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "verify: row of %lld", (long long)max_cols);
  for (int64_t i = 0; i < s->nruntime && st == REFIT_OK; i++) {
    const refit_gen_tensor_t *g = &cat->gen[first + i];
    for (int64_t row = 0; row < g->rows; row++) {
      char name[REFIT_NAME_MAX];
      int64_t src_row, col_off;
      REFIT_CHECK_GOTO(refit_reference_source_row(&cat->model, &cat->generator,
                                                  s->tp_rank, g->name, row, name,
                                                  &src_row, &col_off),
                       st, out);
      int64_t si = refit_catalog_find_src(cat, name);
      if (si < 0) {
        st = REFIT_ERR(REFIT_ERR_INTERNAL,
                       "verify: %s row %lld names unknown source %s", g->name,
                       (long long)row, name);
        goto out;
      }
      REFIT_CHECK_GOTO(s->source.ops->read(s->source.ctx, &cat->src[si], version,
                                           src_row, col_off, 1, g->cols, want),
                       st, out);
      const uint16_t *got =
          (const uint16_t *)s->stores[s->store_of[i]].data + row * g->cols;
      for (int64_t c = 0; c < g->cols; c++) {
        if (got[c] == want[c])
          continue;
        if (bad == 0)
          REFIT_WARN("verify: version %llu, generator rank %d (engine %d, tp "
                     "rank %d), tensor %s: first mismatch at [%lld, %lld]: "
                     "expected 0x%04x (%s row %lld col %lld), actual 0x%04x",
                     (unsigned long long)version, s->role_rank, s->engine,
                     s->tp_rank, g->name, (long long)row, (long long)c, want[c],
                     name, (long long)src_row, (long long)(c + col_off), got[c]);
        bad++;
      }
    }
  }
out:
  free(want);
  *mismatches = bad;
  return st;
}

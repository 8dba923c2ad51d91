/*
 * The session's start-up and teardown: the config read on rank 0 and
 * broadcast, the catalog and the plan (hash compared everywhere), the
 * memory, the transport and the staging areas, each step agreed on by every
 * rank under a deadline; and the collectives' helpers the other session
 * files use. Registration is session_register.c, the trainer's tables
 * trainer.c, the lifecycle of a refit lifecycle.c.
 */
#include "session/session.h"
#include "session/delta_wire.h"
#include "mpi/outlive.h"
#include "session/path.h"
#include "session/zero_copy.h"

#include "fault/fault.h"

#include "core/env.h"
#include "core/hash.h"
#include "core/log.h"
#ifdef REFIT_HAVE_CUDA
#include "device/device.h"
#endif

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Wait for a collective on the session's communicators until `deadline`.
 * A rank that did not join (or an MPI failure) breaks the session: the
 * request can be neither completed nor freed safely, so it goes to
 * outlive.h with the heap blocks blocks[0..n) it uses (the session's own
 * buffers are kept by refit_session_destroy of a broken session), and no
 * later collective can succeed. `limit` names the bound for the message. */
refit_status_t refit_session_join_wait_blocks(refit_session_t *s, MPI_Request *req,
                                              void *const *blocks, int n, double deadline,
                                              const char *what, const char *limit,
                                              double limit_s) {
  refit_status_t st = refit_outlive_wait(req, deadline, what, blocks, n);
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

refit_status_t refit_session_join_wait(refit_session_t *s, MPI_Request *req,
                                       double deadline, const char *what,
                                       const char *limit, double limit_s) {
  return refit_session_join_wait_blocks(s, req, NULL, 0, deadline, what, limit, limit_s);
}

void refit_session_rank_name(const refit_session_t *s, int r, char *out, size_t len) {
  if (r < s->ntrainer)
    snprintf(out, len, "trainer rank %d (world rank %d)", r, r);
  else
    snprintf(out, len, "generator rank %d (world rank %d)", r - s->ntrainer, r);
}

int refit_session_name_pending(const refit_session_t *s, MPI_Request *reqs, const int *peer,
                               int n, char *out, size_t len) {
  int count = 0;
  size_t at = 0;
  out[0] = '\0';
  for (int i = 0; i < n; i++) {
    int flag = 1;
    if (reqs[i] != MPI_REQUEST_NULL)
      MPI_Request_get_status(reqs[i], &flag, MPI_STATUS_IGNORE);
    if (flag)
      continue;
    char name[64];
    refit_session_rank_name(s, peer[i], name, sizeof(name));
    if (at + 1 < len)
      at += (size_t)snprintf(out + at, len - at, "%s%s", count ? ", " : "", name);
    count++;
  }
  if (at >= len && len > 4)
    memcpy(out + len - 4, "...", 4);
  return count;
}

refit_status_t refit_session_gather(refit_session_t *s, const void *mine, void *all,
                                    int bytes, int tag, double deadline, const char *what,
                                    void *const *blocks, int n) {
  const int npeers = s->size - 1;
  refit_status_t st = REFIT_OK;
  unsigned char *into = all;
  /* Receives from every peer, then sends to every peer: reqs[i] and
   * reqs[npeers + i] are peer[i]'s. */
  MPI_Request *reqs = malloc((size_t)(2 * npeers + 1) * sizeof(*reqs));
  int *peer = malloc((size_t)(npeers + 1) * sizeof(*peer));
  if (reqs == NULL || peer == NULL) {
    free(reqs);
    free(peer);
    for (int i = 0; i < n; i++)
      free(blocks[i]);
    s->broken = 1; /* the peers wait for this rank in vain */
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "%s: %d peers", what, npeers);
  }
  memcpy(into + (size_t)s->rank * (size_t)bytes, mine, (size_t)bytes);
  for (int r = 0, i = 0; r < s->size; r++)
    if (r != s->rank)
      peer[i++] = r;
  for (int i = 0; i < 2 * npeers; i++)
    reqs[i] = MPI_REQUEST_NULL;
  for (int i = 0; i < npeers && st == REFIT_OK; i++)
    if (MPI_Irecv(into + (size_t)peer[i] * (size_t)bytes, bytes, MPI_BYTE, peer[i], tag,
                  s->ctrl, &reqs[i]) != MPI_SUCCESS)
      st = REFIT_ERR(REFIT_ERR_MPI, "%s: MPI_Irecv from world rank %d failed", what,
                     peer[i]);
  for (int i = 0; i < npeers && st == REFIT_OK; i++)
    if (MPI_Isend(mine, bytes, MPI_BYTE, peer[i], tag, s->ctrl, &reqs[npeers + i]) !=
        MPI_SUCCESS)
      st = REFIT_ERR(REFIT_ERR_MPI, "%s: MPI_Isend to world rank %d failed", what,
                     peer[i]);
  for (unsigned spins = 0; st == REFIT_OK;) {
    int done = 0;
    if (MPI_Testall(2 * npeers, reqs, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
      st = REFIT_ERR(REFIT_ERR_MPI, "%s: MPI_Testall failed", what);
    else if (done)
      break;
    else if (MPI_Wtime() > deadline) {
      char names[512];
      int late = refit_session_name_pending(s, reqs, peer, npeers, names, sizeof(names));
      const char *how = "did not arrive";
      if (late == 0) { /* every message came; some peer did not take ours */
        late = refit_session_name_pending(s, reqs + npeers, peer, npeers, names,
                                          sizeof(names));
        how = "did not take this rank's message";
      }
      st =
          REFIT_ERR(REFIT_ERR_TIMEOUT,
                    "%s: %d rank%s %s within refit.timeout_s = %.1f s: %s (dead, "
                    "stalled or not started); this session cannot continue",
                    what, late, late == 1 ? "" : "s", how, s->cfg.refit.timeout_s, names);
    } else
      refit_poll_nap(&spins);
  }
  if (st != REFIT_OK) {
    /* What is still posted may complete later, into `all` and the blocks. */
    s->broken = 1;
    refit_outlive_park_all(reqs, 2 * npeers, blocks, n);
  }
  free(reqs);
  free(peer);
  return st;
}

/* Start-up collectives are non-blocking and waited on against a deadline,
 * so a peer that dies during refit_session_open is an error, not a hang:
 * REFIT_STARTUP_TIMEOUT_S (default 300) until the config is known, then
 * refit.timeout_s. `rc` is the MPI call that started the request. */
refit_status_t refit_session_startup_wait(refit_session_t *s, MPI_Request *req, int rc,
                                          const char *what) {
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
refit_status_t refit_session_agree(refit_session_t *s, refit_status_t st,
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
  return refit_session_startup_wait(
      s, &req, MPI_Ibcast(buf, count, type, 0, s->world, &req), what);
}

refit_status_t refit_session_read_config(const char *path, int world_size,
                                         refit_config_t *cfg, char **text, size_t *len) {
  char *errors = NULL;
  const refit_status_t st = refit_config_load(path, world_size, cfg, &errors, text, len);
  if (st == REFIT_OK)
    return REFIT_OK;
  fprintf(stderr, "%s", errors ? errors : refit_last_error());
  if (errors != NULL && errors[0] != '\0' && errors[strlen(errors) - 1] != '\n')
    fputc('\n', stderr);
  free(errors);
  return refit_error_set(st, "config %s rejected (problems listed above)", path);
}

/* Rank 0 reads and validates; the others receive the parsed config. */
static refit_status_t refit_session_config(refit_session_t *s, const char *path) {
  refit_status_t st = REFIT_OK;
  unsigned long long len = 0;
  if (s->rank == 0) {
    st = refit_session_read_config(path, s->size, &s->cfg, &s->config_text,
                                   &s->config_len);
    if (st == REFIT_OK)
      len = s->config_len;
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
refit_status_t refit_session_make_plan(refit_session_t *s, refit_status_t st) {
  refit_plan_options_t opt;
  refit_config_plan_options(&s->cfg, &opt);
  if (s->zc_merged)
    opt.bucket_bytes = REFIT_ZC_BUCKET_BYTES;
  if (st == REFIT_OK)
    st = refit_plan_create(s->cat, &opt, &s->plan);
  if (st == REFIT_OK)
    st = refit_config_plan_check(&s->cfg, s->cat, s->plan);
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
  refit_status_t st =
      refit_catalog_create(&s->cfg.model, &s->cfg.trainer, &s->cfg.generator, &s->cat);
  if (st == REFIT_OK) {
    refit_config_mark_quantized(&s->cfg, s->cat);
    const int64_t n = s->cat->gen_begin[s->cat->generator.tp];
    s->form_votes = calloc((size_t)(2 * n + 2), 1);
    if (s->form_votes == NULL)
      st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "form votes of %lld tensors", (long long)n);
  }
  return refit_session_make_plan(s, st);
}

/* refit.keep_staging: false gives the staging memory back between refits
 * (colocated jobs need it for training) and takes it again at begin. */
void refit_session_release_staging(refit_session_t *s) {
  /* Exposed staging (an abandoned exchange's released requests may still
   * write it) stays where it is. */
  if (s->cfg.refit.keep_staging || s->staging_released || s->exposed)
    return;
  for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++) {
    refit_mem_free(s->mem, s->buffer[i]);
    s->buffer[i] = NULL;
  }
  if (s->loader != NULL && !s->zero_copy)
    refit_loader_release(s->loader);
  s->staging_released = 1;
}

refit_status_t refit_session_acquire_staging(refit_session_t *s) {
  if (!s->staging_released)
    return REFIT_OK;
  REFIT_CHECK(refit_session_alloc_buffers(s));
  if (s->loader != NULL)
    REFIT_CHECK(refit_loader_acquire(s->loader));
  s->staging_released = 0;
  return REFIT_OK;
}

refit_status_t refit_session_alloc_buffers(refit_session_t *s) {
  int64_t max_msgs = 1;
  for (int32_t b = 0; b < s->plan->nbuckets; b++)
    if (s->my_begin[b + 1] - s->my_begin[b] > max_msgs)
      max_msgs = s->my_begin[b + 1] - s->my_begin[b];
  if (s->xfers == NULL)
    s->xfers = malloc((size_t)max_msgs * sizeof(*s->xfers));
  if (s->xfers == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "transfer list of %lld", (long long)max_msgs);
  const int64_t need = s->path->buffer_bytes(s);
  s->buffer_bytes = (size_t)need;
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

/* Open the transport between the plan's (sender, receiver) pairs
 * (collective). */
refit_status_t refit_session_open_transport(refit_session_t *s) {
  int *pairs = NULL, npairs = 0;
  refit_status_t st = refit_session_pairs(s, &pairs, &npairs);
  refit_transport_args_t args = {
      .world = s->world,
      .world_rank = s->rank,
      .world_size = s->size,
      .timeout_s = s->cfg.refit.timeout_s,
      .memory = refit_mem_on_device(s->mem) ? REFIT_MEMORY_DEVICE : REFIT_MEMORY_HOST,
      .pairs = pairs,
      .npairs = npairs,
      .locality = s->cfg.refit.locality,
      /* Only delta: on wraps a fixed-length transport (NCCL): auto runs
       * full refits there, which would pay for the lengths for nothing,
       * until a delta refit over NCCL is measured against a full one. */
      .variable_length = s->cfg.refit.delta == REFIT_DELTA_MODE_ON,
      .lengths_ahead = s->cfg.refit.lengths_ahead};
  if (st == REFIT_OK)
    st = refit_transport_open(s->cfg.refit.transport, &args, &s->transport);
  free(pairs);
  return refit_session_agree(s, st, "opening the transport");
}

/* Transports that write into their peers' memory learn the staging areas
 * once (collective: every rank registers the same number of times); st is
 * this rank's outcome so far. */
refit_status_t refit_session_register_staging(refit_session_t *s, refit_status_t st) {
  for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT && st == REFIT_OK; i++)
    st = refit_transport_register(&s->transport, s->is_trainer ? NULL : s->buffer[i],
                                  s->is_trainer ? 0 : s->buffer_bytes);
  REFIT_CHECK(refit_session_agree(s, st, "registering staging"));
  if (!s->cfg.refit.keep_staging && s->transport.ops->registers_buffers)
    return REFIT_ERR(REFIT_ERR_CONFIG,
                     "refit.keep_staging: false cannot be used with the %s transport, "
                     "which registers staging buffers with its peers once; use "
                     "refit.transport: nccl (or keep_staging: true)",
                     s->transport.ops->name);
  return REFIT_OK;
}

refit_status_t refit_session_make_loader(refit_session_t *s) {
  REFIT_CHECK(refit_loader_create(s->cat, &s->cfg, s->mem, s->tp_rank, s->role_rank,
                                  s->plan, &s->loader));
  s->loader->run_id = s->run_id;
  s->loader->direct = s->zero_copy;
  s->stores = s->loader->stores;
  s->nstores = s->loader->nstores;
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
  /* REFIT_STARTUP_TIMEOUT_S: bounded (a day at most, never inf); a bad
   * value is refused below, on every rank together, after the one wait
   * that needs a deadline before anything is agreed (the default's). */
  s->startup_timeout_s = 300;
  int startup_set;
  const refit_status_t startup_st =
      refit_env_seconds("REFIT_STARTUP_TIMEOUT_S", &s->startup_timeout_s, &startup_set);
  /* A library keeps its traffic off the application's communicator: every
   * collective of the session runs on a duplicate of it. */
  {
    MPI_Request req;
    st = refit_session_startup_wait(s, &req, MPI_Comm_idup(world, &s->world, &req),
                                    "duplicating the communicator");
    if (st != REFIT_OK) {
      void *kept[] = {s}; /* the pending duplicate writes s->world */
      refit_outlive_keep(kept, 1);
      return st;
    }
  }
  /* Errors on the session's communicators are returned, never fatal to the
   * job (MPI_Test reports a collective's errors on MPI_COMM_WORLD's handler
   * otherwise). */
  MPI_Comm_set_errhandler(s->world, MPI_ERRORS_RETURN);
  refit_log_set_rank(s->rank);

  /* One start-up deadline for the job: a bad value on any rank fails every
   * rank's open, and every rank waits what rank 0's REFIT_STARTUP_TIMEOUT_S
   * says until the config is read (a rank with a shorter one would give up
   * on collectives its peers still wait in). */
  REFIT_CHECK_GOTO(refit_session_agree(s, startup_st, "checking REFIT_STARTUP_TIMEOUT_S"),
                   st, err);
  {
    const double mine = s->startup_timeout_s;
    memcpy(&s->startup_u64[0], &mine, sizeof(mine));
    REFIT_CHECK_GOTO(refit_session_bcast(s, s->startup_u64, 1, MPI_UINT64_T,
                                         "rank 0's REFIT_STARTUP_TIMEOUT_S"),
                     st, err);
    double root = 0;
    memcpy(&root, &s->startup_u64[0], sizeof(root));
    if (root != mine)
      REFIT_WARN("REFIT_STARTUP_TIMEOUT_S: %g s here, %g s on rank 0: using rank 0's",
                 mine, root);
    s->startup_timeout_s = root;
  }

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
    REFIT_CHECK_GOTO(refit_session_startup_wait(s, &req,
                                                MPI_Comm_idup(s->world, &s->ctrl, &req),
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
   * must agree, or host memory is used everywhere, which refit.transport nccl
   * and ipc refuse (REFIT_ERR_CONFIG). */
  int want_device = refit_mem_gpu_count() > 0 &&
                    s->cfg.refit.device_map != REFIT_DEVICE_MAP_NONE &&
                    s->cfg.refit.transport != REFIT_TRANSPORT_MPI;
  int all_device = 0;
  {
    MPI_Request req;
    s->startup_buf[0] = want_device;
    REFIT_CHECK_GOTO(
        refit_session_startup_wait(s, &req,
                                   MPI_Iallreduce(&s->startup_buf[0], &s->startup_buf[1],
                                                  1, MPI_INT, MPI_MIN, s->world, &req),
                                   "choosing memory"),
        st, err);
    all_device = s->startup_buf[1];
  }
  if ((s->cfg.refit.transport == REFIT_TRANSPORT_NCCL ||
       s->cfg.refit.transport == REFIT_TRANSPORT_IPC) &&
      !all_device) {
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
      REFIT_INFO("rank %d bound to GPU %d (%s) on %s", s->rank, info.device, info.bus_id,
                 info.host);
  }
#endif
  if (st == REFIT_OK)
    st = refit_mem_create(all_device, &s->mem);
  REFIT_CHECK_GOTO(refit_session_agree(s, st, "choosing memory"), st, err);

  /* Zero copy where every pair of the plan shares a GPU (zero_copy.c), with
   * the plan it takes, before the transport opens for that plan's pairs. */
  REFIT_CHECK_GOTO(refit_zc_locate(s), st, err);
  REFIT_CHECK_GOTO(refit_session_agree(s, refit_zc_decide(s), "refit.zero_copy"), st,
                   err);
  REFIT_CHECK_GOTO(refit_zc_merge(s), st, err);
  refit_session_choose_path(s);
  /* Fault seam: a rank that dies (or stalls) just as the transports start
   * up; its peers' start-up collectives must end at their deadline. */
  if (refit_fault_fires(&s->fault, REFIT_FAULT_PHASE_OPEN, s->rank, 0, s->cfg.source.seed))
    REFIT_CHECK_GOTO(
        refit_fault_act(&s->fault, s->rank, s->cfg.refit.timeout_s, "opening the transport"),
        st, err);
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
    st = refit_session_make_loader(s);
  }
  if (st == REFIT_OK)
    st = refit_session_alloc_buffers(s);
  if (st == REFIT_OK && s->cfg.refit.timeline[0] != '\0' &&
      (s->timeline = refit_timeline_create(s->plan->nbuckets)) == NULL)
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "refit.timeline: the marks' table");
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
  /* Close is not collective and waits for no peer: a refit in flight is
   * abandoned through its transport (one that cannot cancel drops it at
   * once: IPC as it stands, NCCL by aborting its communicators, bounded),
   * and what a late peer may still write or read (staging and
   * send buffers, delta frames, the memory they belong to) is kept, as
   * after any abandoned exchange (outlive.h). */
  for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++) {
    if (s->inflight[i] == NULL)
      continue;
    if (s->transport.ops != NULL) {
      s->transport.ops->abandon(s->transport.ctx, s->inflight[i]);
    } else {
      void *kept[] = {s->inflight[i]}; /* no transport left to cancel it */
      refit_outlive_keep(kept, 1);
    }
    s->inflight[i] = NULL;
    s->exposed = 1;
  }
  const int keep = s->exposed;
  if (keep) {
    void *kept[REFIT_EXCHANGES_IN_FLIGHT + 2];
    int nkept = 0;
    for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++) {
      kept[nkept++] = s->buffer[i];
      s->buffer[i] = NULL;
    }
    kept[nkept++] = s->dw;
    kept[nkept++] = s->mem;
    s->dw = NULL;
    refit_outlive_keep(kept, nkept);
  }
  refit_transport_close(&s->transport);
  refit_source_close(&s->source);
  refit_zc_close(s);
  refit_dw_destroy(s->dw);
  if (s->shard_slab != NULL)
    refit_mem_free(s->mem, s->shard_slab);
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
  if (!keep)
    refit_mem_destroy(s->mem);
  free(s->xfers);
  free(s->my_msgs);
  free(s->my_begin);
  refit_timeline_destroy(s->timeline);
  refit_plan_destroy(s->plan);
  refit_catalog_destroy(s->cat);
  free(s->config_text);
  if (s->ctrl != MPI_COMM_NULL && !s->broken)
    MPI_Comm_free(&s->ctrl);
  if (s->world != MPI_COMM_NULL && !s->broken)
    MPI_Comm_free(&s->world);
  /* After a collective missed its deadline MPI may still write the
   * session's buffers (headers, votes, start-up values): kept. */
  if (s->broken) {
    void *kept[] = {s->header_buf, s->vote_buf, s->form_votes, s};
    refit_outlive_keep(kept, 4);
    return;
  }
  free(s->header_buf);
  free(s->vote_buf);
  free(s->form_votes);
  free(s);
}

/*
 * NCCL transport over device memory. Each exchange is, per communicator it
 * uses, one ncclGroupStart/End of ncclSend/ncclRecv on that communicator's
 * own stream, followed by an event there; the exchange is complete when
 * every one of its events is. Communicators never share a group or a
 * stream, so a communicator stuck on a dead peer (and its abort) leaves the
 * others' kernels alone.
 *
 * Communicators: named `nccl`, one over the world. Inside the per-pair
 * transport (transport_pairs.c), a set of them for the pairs it gives NCCL
 * (create_pairs: the groups of pair_groups.h): a group is a list of world
 * ranks, and every pair of ranks that exchanges bytes shares exactly one
 * group. All ids come
 * from world rank 0 in one MPI broadcast at start-up; every rank then
 * creates its groups' communicators in one NCCL group.
 *
 * The communicators are non-blocking (config.blocking = 0) so that nothing
 * here waits without a deadline: set-up, enqueue and completion are all
 * polled (ncclCommGetAsyncError, cudaEventQuery). When a deadline passes
 * every communicator of the rank is aborted (ncclCommAbort), which also ends
 * kernels still waiting for a dead peer; every later call returns
 * REFIT_ERR_STATE until recover(), at the next begin, builds new ones on
 * every rank.
 *
 * NCCL does not support two ranks of one communicator on one GPU (it can
 * hang), so query() refuses a world in which two ranks share a GPU, and the
 * groups given to refit_nccl_create_groups must not hold two (checked).
 */
#include "device/device.h"
#include "transport/pair_groups.h"
#include "transport/transport.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* NCCL communicators over groups of world ranks: group k holds
 * ranks[begin[k] .. begin[k+1]) (ascending), and a pair of ranks that
 * exchanges bytes over NCCL must share exactly one group (pairs that share
 * several get no route); no group may hold two ranks of one GPU. Every rank
 * passes the same groups. */
typedef struct {
  int ngroups;
  const int *begin; /* [ngroups + 1] */
  const int *ranks;
} refit_nccl_groups_t;

struct refit_exchange {
  cudaEvent_t *done; /* [nmine]: NULL where the communicator has no operation */
  int ndone;
  int n, nsends;
  int *peer; /* receives first, then sends */
};

/* One communicator this rank belongs to. */
typedef struct {
  int group; /* index among all groups (its id's place in the broadcast) */
  int size, rank;
  ncclComm_t comm;
  cudaStream_t stream; /* this communicator's operations */
} refit_nccl_member_t;

typedef struct {
  refit_nccl_member_t *mine; /* the groups holding this rank */
  int nmine, ngroups;
  int *route; /* [world size] index into mine reaching that peer; -1 none, -2 several */
  int *peer_rank; /* [world size] the peer's rank in that communicator */
  MPI_Comm world; /* the session's; recover() builds new communicators */
  double timeout_s;
  int rank, size;
  int aborted; /* set once the communicators were aborted: no use until recover() */
  int lost;    /* an abort never returned: recover() refuses */
} refit_nccl_ctx_t;

/* ncclCommAbort in a thread of its own, so that an abort that never returns
 * (seen when a peer process died while two survivors shared a GPU) cannot
 * hang the caller. */
typedef struct {
  ncclComm_t comm;
  volatile int finished;
} refit_nccl_abort_job_t;

static void *refit_nccl_abort_thread(void *arg) {
  refit_nccl_abort_job_t *job = arg;
  ncclCommAbort(job->comm);
  __atomic_store_n(&job->finished, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* Abort every communicator of the rank, each in its own thread, waiting for
 * them up to REFIT_NCCL_ABORT_S. One that does not return is left to its
 * thread (its memory with it) and the transport is marked lost: recover()
 * then refuses, and the job must restart. */
#define REFIT_NCCL_ABORT_S 5.0
static void refit_nccl_abort(refit_nccl_ctx_t *c) {
  if (c->aborted)
    return;
  c->aborted = 1;
  int n = 0;
  refit_nccl_abort_job_t *jobs = calloc((size_t)(c->nmine ? c->nmine : 1), sizeof(*jobs));
  pthread_t *threads = calloc((size_t)(c->nmine ? c->nmine : 1), sizeof(*threads));
  int *started = calloc((size_t)(c->nmine ? c->nmine : 1), sizeof(int));
  for (int m = 0; m < c->nmine; m++) {
    if (c->mine[m].comm == NULL)
      continue;
    n++;
    if (jobs == NULL || threads == NULL || started == NULL) {
      ncclCommAbort(c->mine[m].comm); /* no memory for a thread: inline */
      continue;
    }
    jobs[m].comm = c->mine[m].comm;
    started[m] =
        pthread_create(&threads[m], NULL, refit_nccl_abort_thread, &jobs[m]) == 0;
    if (!started[m])
      ncclCommAbort(c->mine[m].comm);
  }
  const double until = MPI_Wtime() + REFIT_NCCL_ABORT_S;
  int stuck = 0;
  for (int m = 0; started != NULL && m < c->nmine; m++) {
    if (!started[m])
      continue;
    unsigned spins = 0;
    while (!__atomic_load_n(&jobs[m].finished, __ATOMIC_ACQUIRE) && MPI_Wtime() < until)
      refit_poll_nap(&spins);
    if (__atomic_load_n(&jobs[m].finished, __ATOMIC_ACQUIRE)) {
      pthread_join(threads[m], NULL);
    } else {
      pthread_detach(threads[m]);
      stuck++;
    }
  }
  if (stuck > 0) {
    c->lost = 1;
    REFIT_WARN("nccl transport: %d of %d communicator aborts did not return within "
               "%.0f s; left behind (this job's NCCL transport cannot be repaired: "
               "restart the job)",
               stuck, n, REFIT_NCCL_ABORT_S);
    /* The stuck threads still use their jobs: leave them allocated. */
    jobs = NULL;
  } else if (n > 0) {
    REFIT_WARN("nccl transport: aborted %d communicator%s", n, n == 1 ? "" : "s");
  }
  free(jobs);
  free(threads);
  free(started);
}

/* Wait until communicator m has left ncclInProgress, by `deadline`; on an
 * error or at the deadline every communicator is aborted. `what` names the
 * operation for messages. */
static refit_status_t refit_nccl_settle_one(refit_nccl_ctx_t *c, int m, double deadline,
                                            const char *what) {
  unsigned spins = 0;
  ncclComm_t comm = c->mine[m].comm;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t res = ncclCommGetAsyncError(comm, &state);
    if (res != ncclSuccess) {
      refit_status_t st =
          refit_nccl_error(res, comm, "ncclCommGetAsyncError", __FILE__, __LINE__);
      refit_nccl_abort(c);
      return st;
    }
    if (state == ncclSuccess)
      return REFIT_OK;
    if (state != ncclInProgress) {
      refit_status_t st = refit_nccl_error(state, comm, what, __FILE__, __LINE__);
      refit_nccl_abort(c);
      return st;
    }
    if (MPI_Wtime() > deadline) {
      refit_nccl_abort(c);
      return REFIT_ERR(REFIT_ERR_TIMEOUT,
                       "nccl transport: %s still in progress at the deadline "
                       "(communicator %d of %d ranks); communicators aborted",
                       what, c->mine[m].group, c->mine[m].size);
    }
    refit_poll_nap(&spins);
  }
}

static refit_status_t refit_nccl_settle(refit_nccl_ctx_t *c, double deadline,
                                        const char *what) {
  for (int m = 0; m < c->nmine; m++)
    REFIT_CHECK(refit_nccl_settle_one(c, m, deadline, what));
  return REFIT_OK;
}

static refit_status_t refit_nccl_query(const refit_transport_args_t *args) {
  refit_device_locality_t loc;
  REFIT_CHECK(refit_device_locality(args->world, args->timeout_s, &loc));
  refit_status_t st = REFIT_OK;
  if (loc.shared_a >= 0)
    st = REFIT_ERR(REFIT_ERR_CONFIG,
                   "nccl transport: ranks %d and %d use the same GPU (%d "
                   "ranks on %d GPUs); one NCCL communicator cannot hold two "
                   "ranks of one GPU: use refit.transport auto (CUDA IPC between "
                   "ranks of one node), ipc, or give every rank its own GPU",
                   loc.shared_a, loc.shared_b, loc.size, loc.ngpus);
  refit_device_locality_free(&loc);
  return st;
}

static void refit_nccl_destroy(void *ctx);

/* Collective over the world: new communicators for this rank's groups, by
 * `deadline`. Rank 0 makes every group's id; every rank enters the broadcast
 * even if that failed, and the failure travels as an all-zero "ok" word
 * after the ids. */
static refit_status_t refit_nccl_connect(refit_nccl_ctx_t *c, double deadline) {
  refit_status_t st = REFIT_OK;
  const size_t idbytes = (size_t)c->ngroups * sizeof(ncclUniqueId);
  unsigned char *msg = calloc(1, idbytes + sizeof(int));
  if (msg == NULL) /* the others fail at the broadcast's deadline */
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "nccl transport: %d ids", c->ngroups);
  int ok = 1;
  if (c->rank == 0)
    for (int k = 0; k < c->ngroups && ok; k++) {
      ncclUniqueId id;
      ncclResult_t res = ncclGetUniqueId(&id);
      if (res != ncclSuccess) {
        st = refit_nccl_error(res, NULL, "ncclGetUniqueId", __FILE__, __LINE__);
        ok = 0;
      }
      memcpy(msg + (size_t)k * sizeof(id), &id, sizeof(id));
    }
  memcpy(msg + idbytes, &ok, sizeof(ok));
  MPI_Request req = MPI_REQUEST_NULL;
  if (MPI_Ibcast(msg, (int)(idbytes + sizeof(int)), MPI_BYTE, 0, c->world, &req) !=
      MPI_SUCCESS) {
    free(msg);
    return REFIT_ERR(REFIT_ERR_MPI, "nccl transport: broadcast of the ids");
  }
  /* At the deadline the broadcast is still pending and may yet write into
   * msg: it is left allocated (the session cannot go on after a timeout). */
  REFIT_CHECK(
      refit_mpi_request_wait(&req, deadline, "nccl transport: broadcast of the ids"));
  memcpy(&ok, msg + idbytes, sizeof(ok));
  if (!ok) {
    free(msg);
    return st != REFIT_OK ? st
                          : REFIT_ERR(REFIT_ERR_PEER, "nccl transport: rank 0 could "
                                                      "not create the NCCL unique ids");
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  c->aborted = 0;
  for (int m = 0; m < c->nmine; m++)
    c->mine[m].comm = NULL;
  ncclResult_t res = ncclGroupStart();
  for (int m = 0; m < c->nmine && (res == ncclSuccess || res == ncclInProgress); m++) {
    ncclUniqueId id;
    memcpy(&id, msg + (size_t)c->mine[m].group * sizeof(ncclUniqueId), sizeof(id));
    res = ncclCommInitRankConfig(&c->mine[m].comm, c->mine[m].size, id, c->mine[m].rank,
                                 &config);
  }
  ncclResult_t end = ncclGroupEnd();
  free(msg);
  if (res == ncclSuccess || res == ncclInProgress)
    res = end;
  if (res != ncclSuccess && res != ncclInProgress) {
    st = refit_nccl_error(res, NULL, "ncclCommInitRankConfig", __FILE__, __LINE__);
    refit_nccl_abort(c);
    return st;
  }
  REFIT_CHECK(refit_nccl_settle(c, deadline, "ncclCommInitRankConfig"));
  REFIT_INFO("nccl transport: %d communicator%s ready (sizes from %d)", c->nmine,
             c->nmine == 1 ? "" : "s", c->nmine > 0 ? c->mine[0].size : 0);
  return REFIT_OK;
}

static refit_status_t refit_nccl_ctx_new(const refit_transport_args_t *args,
                                         refit_nccl_ctx_t **out) {
  refit_nccl_ctx_t *c = calloc(1, sizeof(*c));
  if (c == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "nccl transport: context");
  c->timeout_s = args->timeout_s;
  c->rank = args->world_rank;
  c->size = args->world_size;
  c->world = args->world;
  c->route = malloc((size_t)c->size * sizeof(int));
  c->peer_rank = malloc((size_t)c->size * sizeof(int));
  if (c->route == NULL || c->peer_rank == NULL) {
    refit_nccl_destroy(c);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "nccl transport: routes of %d ranks", c->size);
  }
  for (int r = 0; r < c->size; r++)
    c->route[r] = c->peer_rank[r] = -1;
  *out = c;
  return REFIT_OK;
}

/* The context over the groups `g` (collective over args->world). */
static refit_status_t refit_nccl_create_groups(const refit_transport_args_t *args,
                                               const refit_nccl_groups_t *g, void **out) {
  refit_status_t st = REFIT_OK;
  refit_nccl_ctx_t *c = NULL;
  REFIT_CHECK(refit_nccl_ctx_new(args, &c));
  c->ngroups = g->ngroups;
  int n = 0;
  for (int k = 0; k < g->ngroups; k++)
    for (int i = g->begin[k]; i < g->begin[k + 1]; i++)
      n += g->ranks[i] == c->rank;
  c->mine = calloc((size_t)(n ? n : 1), sizeof(*c->mine));
  if (c->mine == NULL) {
    refit_nccl_destroy(c);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "nccl transport: %d communicators", n);
  }
  for (int k = 0; k < g->ngroups; k++) {
    const int *r = g->ranks + g->begin[k], size = g->begin[k + 1] - g->begin[k];
    int me = -1;
    for (int i = 0; i < size; i++)
      if (r[i] == c->rank)
        me = i;
    if (me < 0)
      continue;
    refit_nccl_member_t *m = &c->mine[c->nmine];
    m->group = k;
    m->size = size;
    m->rank = me;
    for (int i = 0; i < size; i++) {
      if (i == me)
        continue;
      /* A peer met in two groups (ranks of one node in the per-pair
       * transport, which never exchange over NCCL) has no route. */
      if (c->route[r[i]] == -1) {
        c->route[r[i]] = c->nmine;
        c->peer_rank[r[i]] = i;
      } else {
        c->route[r[i]] = -2;
      }
    }
    c->nmine++;
  }
  for (int m = 0; m < c->nmine; m++)
    REFIT_CHECK_GOTO(refit_device_stream_create(&c->mine[m].stream), st, err);
  REFIT_CHECK_GOTO(refit_nccl_connect(c, MPI_Wtime() + args->timeout_s), st, err);
  *out = c;
  return REFIT_OK;

err:
  refit_nccl_destroy(c);
  return st;
}

static refit_status_t refit_nccl_create(const refit_transport_args_t *args, void **out) {
  int *ranks = malloc((size_t)args->world_size * sizeof(int));
  if (ranks == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "nccl transport: world of %d",
                     args->world_size);
  for (int r = 0; r < args->world_size; r++)
    ranks[r] = r;
  const int begin[2] = {0, args->world_size};
  const refit_nccl_groups_t world = {1, begin, ranks};
  refit_status_t st = refit_nccl_create_groups(args, &world, out);
  free(ranks);
  return st;
}

/* Per pair: two ranks of different GPUs with device memory (one
 * communicator cannot hold two ranks of one GPU). */
static int refit_nccl_can_connect(const refit_pair_facts_t *pair) {
  return pair->memory == REFIT_MEMORY_DEVICE && !pair->same_gpu;
}

/* The per-pair transport's pairs for NCCL: the communicators of their groups
 * (pair_groups.h), none when no pair was given. Every rank computes the same
 * groups from the same pairs and locality; a failure here is the same on
 * every rank (out of memory aside, which the session's agreement after
 * opening reports). */
static refit_status_t refit_nccl_create_pairs(const refit_transport_args_t *args,
                                              const refit_pair_locality_t *loc,
                                              void **out) {
  int ngroups = 0, *begin = NULL, *ranks = NULL;
  REFIT_CHECK(refit_pair_groups(args->pairs, args->npairs, args->world_size, loc->node_of,
                                loc->gpu_of, loc->gpus_shared, &ngroups, &begin, &ranks));
  refit_status_t st = REFIT_OK;
  if (ngroups > 0) {
    const refit_nccl_groups_t g = {ngroups, begin, ranks};
    st = refit_nccl_create_groups(args, &g, out);
  }
  free(begin);
  free(ranks);
  return st;
}

static int refit_nccl_healthy(void *ctx) {
  const refit_nccl_ctx_t *c = ctx;
  return !c->aborted;
}

/* After a failed refit every rank replaces its communicators: one aborted on
 * any rank cannot serve the others, and aborting a healthy one also ends
 * kernels still waiting on the failed exchange. */
static refit_status_t refit_nccl_recover(void *ctx, double deadline) {
  refit_nccl_ctx_t *c = ctx;
  const int was_aborted = c->aborted;
  refit_nccl_abort(c); /* a healthy one too: it may hold the failed exchange */
  if (c->lost)
    return REFIT_ERR(REFIT_ERR_PEER,
                     "nccl transport: a communicator of rank %d could not be "
                     "aborted after the failed refit; restart the job",
                     c->rank);
  for (int m = 0; m < c->nmine; m++) {
    cudaError_t err = cudaStreamSynchronize(c->mine[m].stream);
    if (err != cudaSuccess)
      return refit_cuda_error(err, "cudaStreamSynchronize (nccl recover)", __FILE__,
                              __LINE__);
  }
  REFIT_CHECK(refit_nccl_connect(c, deadline));
  REFIT_INFO("nccl transport: new communicators after the failed refit%s",
             was_aborted ? " (this rank's were aborted)" : "");
  return REFIT_OK;
}

static void refit_nccl_exchange_free(refit_exchange_t *ex) {
  if (ex == NULL)
    return;
  if (ex->done != NULL)
    for (int m = 0; m < ex->ndone; m++)
      if (ex->done[m] != NULL)
        refit_device_event_destroy(ex->done[m]);
  free(ex->done);
  free(ex->peer);
  free(ex);
}

/* The communicator (index into mine) that reaches world rank `peer`. */
static refit_status_t refit_nccl_member_of(const refit_nccl_ctx_t *c, int peer, int *m) {
  const int r = peer >= 0 && peer < c->size ? c->route[peer] : -1;
  if (r < 0)
    return REFIT_ERR(REFIT_ERR_INTERNAL,
                     "nccl transport: %s communicator of rank %d reaches rank "
                     "%d (the transport was built for other pairs)",
                     r == -2 ? "more than one" : "no", c->rank, peer);
  *m = r;
  return REFIT_OK;
}

static refit_status_t refit_nccl_start(void *ctx, const refit_xfer_t *sends, int nsends,
                                       const refit_xfer_t *recvs, int nrecvs, int tag,
                                       refit_exchange_t **out) {
  refit_nccl_ctx_t *c = ctx;
  refit_status_t st = REFIT_OK;
  refit_exchange_t *ex = NULL;
  const int n = nsends + nrecvs;
  /* NCCL matches sends to receives by order per peer pair; the tag only
   * names the exchange in messages. */
  (void)tag;

  if (c->aborted)
    return REFIT_ERR(REFIT_ERR_STATE, "nccl transport: the communicators were "
                                      "aborted after an earlier failure");
  ex = calloc(1, sizeof(*ex));
  if (ex == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "nccl transport: exchange");
  ex->peer = malloc((size_t)(n ? n : 1) * sizeof(*ex->peer));
  ex->done = calloc((size_t)(c->nmine ? c->nmine : 1), sizeof(*ex->done));
  if (ex->peer == NULL || ex->done == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "nccl transport: %d peers", n);
    goto err;
  }
  ex->ndone = c->nmine;
  /* An event for each communicator the exchange uses. */
  for (int i = 0; i < n; i++) {
    const refit_xfer_t *x = i < nrecvs ? &recvs[i] : &sends[i - nrecvs];
    int m = 0;
    REFIT_CHECK_GOTO(refit_nccl_member_of(c, x->peer, &m), st, err);
    if (ex->done[m] == NULL)
      REFIT_CHECK_GOTO(refit_device_event_create(&ex->done[m]), st, err);
    ex->peer[ex->n++] = x->peer;
    ex->nsends += i >= nrecvs;
  }

  /* A non-blocking communicator takes no new call while the previous one is
   * still being set up (first contact with a peer connects in the
   * background). */
  const double deadline = MPI_Wtime() + c->timeout_s;
  REFIT_CHECK_GOTO(refit_nccl_settle(c, deadline, "previous exchange"), st, err);
  for (int m = 0; m < c->nmine; m++) {
    if (ex->done[m] == NULL)
      continue;
    const refit_nccl_member_t *mb = &c->mine[m];
    REFIT_NCCL_CHECK_GOTO(ncclGroupStart(), mb->comm, st, err);
    for (int i = 0; i < n; i++) {
      const int is_recv = i < nrecvs;
      const refit_xfer_t *x = is_recv ? &recvs[i] : &sends[i - nrecvs];
      if (c->route[x->peer] != m)
        continue;
      const int rank = c->peer_rank[x->peer];
      if (is_recv)
        REFIT_NCCL_CHECK_GOTO(
            ncclRecv(x->buf, x->bytes, ncclUint8, rank, mb->comm, mb->stream), mb->comm,
            st, err_group);
      else
        REFIT_NCCL_CHECK_GOTO(
            ncclSend(x->buf, x->bytes, ncclUint8, rank, mb->comm, mb->stream), mb->comm,
            st, err_group);
    }
    REFIT_NCCL_CHECK_GOTO(ncclGroupEnd(), mb->comm, st, err_abort);
    /* The operations are on the stream only once the group has settled. */
    REFIT_CHECK_GOTO(refit_nccl_settle_one(c, m, deadline, "ncclGroupEnd"), st, err);
    REFIT_CUDA_CHECK_GOTO(cudaEventRecord(ex->done[m], mb->stream), st, err_abort);
  }
  *out = ex;
  return REFIT_OK;

err_group:
  ncclGroupEnd();
err_abort:
  /* Part of a group may be queued: the communicators are in an unknown state. */
  refit_nccl_abort(c);
err:
  refit_nccl_exchange_free(ex);
  return st;
}

/* One look at an exchange: *done once its event completed; an asynchronous
 * NCCL error aborts. */
static refit_status_t refit_nccl_poll(refit_nccl_ctx_t *c, refit_exchange_t *ex,
                                      const char *phase, int *done) {
  *done = 1;
  for (int m = 0; m < ex->ndone && *done; m++)
    if (ex->done[m] != NULL)
      REFIT_CHECK(refit_device_event_done(ex->done[m], done));
  if (*done)
    return REFIT_OK;
  for (int m = 0; m < c->nmine; m++) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t res = ncclCommGetAsyncError(c->mine[m].comm, &state);
    if (res != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      refit_status_t st = refit_nccl_error(res != ncclSuccess ? res : state,
                                           c->mine[m].comm, phase, __FILE__, __LINE__);
      refit_nccl_abort(c);
      return st;
    }
  }
  return REFIT_OK;
}

static refit_status_t refit_nccl_wait(void *ctx, refit_exchange_t *ex, double deadline,
                                      const char *phase) {
  refit_nccl_ctx_t *c = ctx;
  refit_status_t st = REFIT_OK;
  unsigned spins = 0;

  if (c->aborted) {
    st = REFIT_ERR(REFIT_ERR_STATE,
                   "%s: nccl transport: the communicators were aborted after an "
                   "earlier failure",
                   phase);
    goto out;
  }
  for (;;) {
    int done = 0;
    REFIT_CHECK_GOTO(refit_nccl_poll(c, ex, phase, &done), st, abort);
    if (done)
      break;
    if (MPI_Wtime() > deadline) {
      /* A group completes as one kernel: every peer of it is outstanding. */
      char peers[256] = "";
      size_t used = 0;
      for (int i = 0; i < ex->n && used + 16 < sizeof(peers); i++)
        used += (size_t)snprintf(peers + used, sizeof(peers) - used, "%s%s %d",
                                 used ? ", " : "", i < ex->n - ex->nsends ? "from" : "to",
                                 ex->peer[i]);
      st = REFIT_ERR(REFIT_ERR_TIMEOUT,
                     "%s: nccl transport: %d messages still outstanding at the "
                     "deadline (peer ranks: %s); communicators aborted",
                     phase, ex->n, peers);
      goto abort;
    }
    refit_poll_nap(&spins);
  }
  goto out;

abort:
  refit_nccl_abort(c);
out:
  /* After an abort the event may never complete; destroying it is still
   * legal (resources are released once the stream is done with it). */
  refit_nccl_exchange_free(ex);
  return st;
}

static refit_status_t refit_nccl_test(void *ctx, refit_exchange_t *ex, int *done) {
  refit_nccl_ctx_t *c = ctx;
  *done = 0;
  refit_status_t st =
      c->aborted ? REFIT_ERR(REFIT_ERR_STATE, "nccl transport: the communicators were "
                                              "aborted after an earlier failure")
                 : refit_nccl_poll(c, ex, "nccl exchange", done);
  if (st != REFIT_OK || *done)
    refit_nccl_exchange_free(ex);
  return st;
}

static void refit_nccl_destroy(void *ctx) {
  refit_nccl_ctx_t *c = ctx;
  if (c == NULL)
    return;
  if (!c->aborted) {
    /* Finalize flushes outstanding work, polled against the timeout; a
     * communicator that cannot finish is aborted instead of hanging. */
    int ok = 1;
    for (int m = 0; m < c->nmine && ok; m++) {
      ncclResult_t res =
          c->mine[m].comm != NULL ? ncclCommFinalize(c->mine[m].comm) : ncclSuccess;
      ok = res == ncclSuccess || res == ncclInProgress;
    }
    if (ok && refit_nccl_settle(c, MPI_Wtime() + c->timeout_s, "ncclCommFinalize") ==
                  REFIT_OK) {
      for (int m = 0; m < c->nmine; m++)
        if (c->mine[m].comm != NULL)
          ncclCommDestroy(c->mine[m].comm);
    } else {
      refit_nccl_abort(c);
    }
  }
  for (int m = 0; m < c->nmine; m++)
    if (c->mine[m].stream != NULL)
      refit_device_stream_destroy(c->mine[m].stream);
  free(c->mine);
  free(c->route);
  free(c->peer_rank);
  free(c);
}

/* NCCL cannot cancel a posted send or receive: a wait whose deadline has
 * passed aborts the communicators (recover() builds new ones). */
static void refit_nccl_abandon(void *ctx, refit_exchange_t *ex) {
  (void)refit_nccl_wait(ctx, ex, MPI_Wtime() - 1, "abandoned");
}

const refit_transport_ops_t refit_transport_nccl = {
    .name = "nccl",
    .kind = REFIT_TRANSPORT_NCCL,
    .memory = REFIT_MEMORY_DEVICE,
    .query = refit_nccl_query,
    .create = refit_nccl_create,
    .can_connect = refit_nccl_can_connect,
    .create_pairs = refit_nccl_create_pairs,
    .start = refit_nccl_start,
    .wait = refit_nccl_wait,
    .test = refit_nccl_test,
    .abandon = refit_nccl_abandon,
    .destroy = refit_nccl_destroy,
    .register_buffer = refit_transport_register_none,
    .healthy = refit_nccl_healthy,
    .recover = refit_nccl_recover,
};

/*
 * NCCL transport over device memory: one communicator over the world, made
 * at start-up from an MPI-broadcast ncclUniqueId; each exchange is one
 * ncclGroupStart/End of ncclSend/ncclRecv on the transport's stream.
 *
 * The communicator is non-blocking (config.blocking = 0) so that nothing
 * here waits without a deadline: set-up, enqueue and completion are all
 * polled (ncclCommGetAsyncError, cudaEventQuery). When a deadline passes the
 * communicator is aborted (ncclCommAbort), which also ends kernels still
 * waiting for a dead peer; every later call returns REFIT_ERR_STATE.
 *
 * NCCL does not support two ranks of one communicator on one GPU (it can
 * hang), so query() refuses a world in which two ranks share a GPU; such
 * pairs use the IPC transport.
 */
#include "device.h"
#include "transport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct refit_exchange {
  cudaEvent_t done;
  int n, nsends;
  int *peer; /* receives first, then sends */
};

typedef struct {
  ncclComm_t comm;
  cudaStream_t stream;
  double timeout_s;
  int rank;
  int aborted; /* set once the communicator was aborted: no further use */
} refit_nccl_ctx_t;

static void refit_nccl_nap(unsigned *spins) {
  /* Spin briefly for latency, then yield the core. */
  if (++*spins > 64) {
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
}

static void refit_nccl_abort(refit_nccl_ctx_t *c) {
  if (c->comm != NULL && !c->aborted) {
    REFIT_WARN("nccl transport: aborting the communicator");
    ncclCommAbort(c->comm);
    c->aborted = 1;
  }
}

/* Wait until the communicator has left ncclInProgress, by `deadline`.
 * `what` names the operation for messages. */
static refit_status_t refit_nccl_settle(refit_nccl_ctx_t *c, double deadline,
                                        const char *what) {
  unsigned spins = 0;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t res = ncclCommGetAsyncError(c->comm, &state);
    if (res != ncclSuccess)
      return refit_nccl_error(res, c->comm, "ncclCommGetAsyncError", __FILE__,
                              __LINE__);
    if (state == ncclSuccess)
      return REFIT_OK;
    if (state != ncclInProgress) {
      refit_status_t st =
          refit_nccl_error(state, c->comm, what, __FILE__, __LINE__);
      refit_nccl_abort(c);
      return st;
    }
    if (MPI_Wtime() > deadline) {
      refit_nccl_abort(c);
      return REFIT_ERR(REFIT_ERR_TIMEOUT,
                       "nccl transport: %s still in progress at the deadline; "
                       "communicator aborted",
                       what);
    }
    refit_nccl_nap(&spins);
  }
}

static refit_status_t refit_nccl_query(const refit_transport_args_t *args) {
  refit_device_locality_t loc;
  REFIT_CHECK(refit_device_locality(args->world, &loc));
  refit_status_t st = REFIT_OK;
  if (loc.shared_a >= 0)
    st = REFIT_ERR(REFIT_ERR_CONFIG,
                   "nccl transport: ranks %d and %d use the same GPU (%d "
                   "ranks on %d GPUs); one NCCL communicator cannot hold two "
                   "ranks of one GPU: use refit.transport ipc (one node) or "
                   "give every rank its own GPU",
                   loc.shared_a, loc.shared_b, loc.size, loc.ngpus);
  refit_device_locality_free(&loc);
  return st;
}

static void refit_nccl_destroy(void *ctx);

static refit_status_t refit_nccl_create(const refit_transport_args_t *args,
                                        void **out) {
  refit_status_t st = REFIT_OK;
  ncclUniqueId id;
  refit_nccl_ctx_t *c = calloc(1, sizeof(*c));
  if (c == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "nccl transport: context");
  c->timeout_s = args->timeout_s;
  c->rank = args->world_rank;

  /* Rank 0 makes the id; every rank enters the broadcast even if that failed,
   * and the failure travels as an all-zero flag. */
  int ok = 1;
  memset(&id, 0, sizeof(id));
  if (args->world_rank == 0) {
    ncclResult_t res = ncclGetUniqueId(&id);
    if (res != ncclSuccess) {
      st = refit_nccl_error(res, NULL, "ncclGetUniqueId", __FILE__, __LINE__);
      ok = 0;
    }
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, args->world);
  if (!ok) {
    if (st == REFIT_OK)
      st = REFIT_ERR(REFIT_ERR_PEER, "nccl transport: rank 0 could not create "
                                     "the NCCL unique id");
    goto err;
  }
  int rc = MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, args->world);
  if (rc != MPI_SUCCESS) {
    st = REFIT_ERR(REFIT_ERR_MPI, "nccl transport: broadcast of the id (%d)",
                   rc);
    goto err;
  }
  REFIT_CHECK_GOTO(refit_device_stream_create(&c->stream), st, err);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  REFIT_NCCL_CHECK_GOTO(ncclCommInitRankConfig(&c->comm, args->world_size, id,
                                               args->world_rank, &config),
                        c->comm, st, err);
  REFIT_CHECK_GOTO(refit_nccl_settle(c, MPI_Wtime() + args->timeout_s,
                                     "ncclCommInitRankConfig"),
                   st, err);
  REFIT_INFO("nccl transport: communicator of %d ranks ready",
             args->world_size);
  *out = c;
  return REFIT_OK;

err:
  refit_nccl_destroy(c);
  return st;
}

static void refit_nccl_exchange_free(refit_exchange_t *ex) {
  if (ex == NULL)
    return;
  refit_device_event_destroy(ex->done);
  free(ex->peer);
  free(ex);
}

static refit_status_t refit_nccl_start(void *ctx, const refit_xfer_t *sends,
                                       int nsends, const refit_xfer_t *recvs,
                                       int nrecvs, int tag,
                                       refit_exchange_t **out) {
  refit_nccl_ctx_t *c = ctx;
  refit_status_t st = REFIT_OK;
  refit_exchange_t *ex = NULL;
  const int n = nsends + nrecvs;
  /* NCCL matches sends to receives by order per peer pair; the tag only
   * names the exchange in messages. */
  (void)tag;

  if (c->aborted)
    return REFIT_ERR(REFIT_ERR_STATE, "nccl transport: the communicator was "
                                      "aborted after an earlier failure");
  ex = calloc(1, sizeof(*ex));
  if (ex == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "nccl transport: exchange");
  ex->peer = malloc((size_t)(n ? n : 1) * sizeof(*ex->peer));
  if (ex->peer == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "nccl transport: %d peers", n);
    goto err;
  }
  REFIT_CHECK_GOTO(refit_device_event_create(&ex->done), st, err);

  /* A non-blocking communicator takes no new call while the previous one is
   * still being set up (first contact with a peer connects in the
   * background). */
  const double deadline = MPI_Wtime() + c->timeout_s;
  REFIT_CHECK_GOTO(refit_nccl_settle(c, deadline, "previous exchange"), st,
                   err);
  REFIT_NCCL_CHECK_GOTO(ncclGroupStart(), c->comm, st, err);
  for (int i = 0; i < nrecvs; i++) {
    ex->peer[ex->n++] = recvs[i].peer;
    REFIT_NCCL_CHECK_GOTO(ncclRecv(recvs[i].buf, recvs[i].bytes, ncclUint8,
                                   recvs[i].peer, c->comm, c->stream),
                          c->comm, st, err_group);
  }
  for (int i = 0; i < nsends; i++) {
    ex->peer[ex->n++] = sends[i].peer;
    ex->nsends++;
    REFIT_NCCL_CHECK_GOTO(ncclSend(sends[i].buf, sends[i].bytes, ncclUint8,
                                   sends[i].peer, c->comm, c->stream),
                          c->comm, st, err_group);
  }
  REFIT_NCCL_CHECK_GOTO(ncclGroupEnd(), c->comm, st, err_abort);
  /* The operations are on the stream only once the group has settled. */
  REFIT_CHECK_GOTO(refit_nccl_settle(c, deadline, "ncclGroupEnd"), st, err);
  REFIT_CUDA_CHECK_GOTO(cudaEventRecord(ex->done, c->stream), st, err_abort);
  *out = ex;
  return REFIT_OK;

err_group:
  ncclGroupEnd();
err_abort:
  /* Part of a group may be queued: the communicator is in an unknown state. */
  refit_nccl_abort(c);
err:
  refit_nccl_exchange_free(ex);
  return st;
}

static refit_status_t refit_nccl_wait(void *ctx, refit_exchange_t *ex,
                                      double deadline, const char *phase) {
  refit_nccl_ctx_t *c = ctx;
  refit_status_t st = REFIT_OK;
  unsigned spins = 0;

  if (c->aborted) {
    st = REFIT_ERR(REFIT_ERR_STATE,
                   "%s: nccl transport: the communicator was aborted after an "
                   "earlier failure",
                   phase);
    goto out;
  }
  for (;;) {
    int done = 0;
    REFIT_CHECK_GOTO(refit_device_event_done(ex->done, &done), st, abort);
    if (done)
      break;
    ncclResult_t state = ncclSuccess;
    ncclResult_t res = ncclCommGetAsyncError(c->comm, &state);
    if (res != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      st = refit_nccl_error(res != ncclSuccess ? res : state, c->comm, phase,
                            __FILE__, __LINE__);
      goto abort;
    }
    if (MPI_Wtime() > deadline) {
      /* A group completes as one kernel: every peer of it is outstanding. */
      char peers[256] = "";
      size_t used = 0;
      for (int i = 0; i < ex->n && used + 16 < sizeof(peers); i++)
        used += (size_t)snprintf(peers + used, sizeof(peers) - used, "%s%s %d",
                                 used ? ", " : "",
                                 i < ex->n - ex->nsends ? "from" : "to",
                                 ex->peer[i]);
      st = REFIT_ERR(REFIT_ERR_TIMEOUT,
                     "%s: nccl transport: %d messages still outstanding at the "
                     "deadline (peer ranks: %s); communicator aborted",
                     phase, ex->n, peers);
      goto abort;
    }
    refit_nccl_nap(&spins);
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

static void refit_nccl_destroy(void *ctx) {
  refit_nccl_ctx_t *c = ctx;
  if (c == NULL)
    return;
  if (c->comm != NULL && !c->aborted) {
    /* Finalize flushes outstanding work, polled against the timeout; a
     * communicator that cannot finish is aborted instead of hanging. */
    ncclResult_t res = ncclCommFinalize(c->comm);
    if ((res == ncclSuccess || res == ncclInProgress) &&
        refit_nccl_settle(c, MPI_Wtime() + c->timeout_s,
                          "ncclCommFinalize") == REFIT_OK)
      ncclCommDestroy(c->comm);
    else
      refit_nccl_abort(c);
  }
  refit_device_stream_destroy(c->stream);
  free(c);
}

const refit_transport_ops_t refit_transport_nccl = {
    .name = "nccl",
    .kind = REFIT_TRANSPORT_NCCL,
    .memory = REFIT_MEMORY_DEVICE,
    .query = refit_nccl_query,
    .create = refit_nccl_create,
    .start = refit_nccl_start,
    .wait = refit_nccl_wait,
    .destroy = refit_nccl_destroy,
    .register_buffer = NULL,
};

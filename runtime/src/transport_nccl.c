/*
 * NCCL transport over device memory: one communicator over the world, made
 * at start-up from an MPI-broadcast ncclUniqueId; each exchange is one
 * ncclGroupStart/End of ncclSend/ncclRecv on the transport's stream.
 *
 * The communicator is non-blocking (config.blocking = 0) so that nothing
 * here waits without a deadline: set-up, enqueue and completion are all
 * polled (ncclCommGetAsyncError, cudaEventQuery). When a deadline passes the
 * communicator is aborted (ncclCommAbort), which also ends kernels still
 * waiting for a dead peer; every later call returns REFIT_ERR_STATE until
 * recover(), at the next begin, builds a new communicator on every rank.
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

struct refit_exchange {
  cudaEvent_t done;
  int n, nsends;
  int *peer; /* receives first, then sends */
};

typedef struct {
  ncclComm_t comm;
  cudaStream_t stream;
  MPI_Comm world; /* the session's; recover() builds a new communicator */
  double timeout_s;
  int rank, size;
  int aborted; /* set once the communicator was aborted: no use until recover() */
} refit_nccl_ctx_t;

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
    refit_poll_nap(&spins);
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

/* Collective: a new communicator over the world, by `deadline`. Rank 0
 * makes the id; every rank enters the broadcast even if that failed, and the
 * failure travels as an all-zero "ok" word beside the id. */
static refit_status_t refit_nccl_connect(refit_nccl_ctx_t *c, double deadline) {
  refit_status_t st = REFIT_OK;
  struct {
    ncclUniqueId id;
    int ok;
  } msg;
  memset(&msg, 0, sizeof(msg));
  msg.ok = 1;
  if (c->rank == 0) {
    ncclResult_t res = ncclGetUniqueId(&msg.id);
    if (res != ncclSuccess) {
      st = refit_nccl_error(res, NULL, "ncclGetUniqueId", __FILE__, __LINE__);
      msg.ok = 0;
    }
  }
  MPI_Request req = MPI_REQUEST_NULL;
  if (MPI_Ibcast(&msg, (int)sizeof(msg), MPI_BYTE, 0, c->world, &req) != MPI_SUCCESS)
    return REFIT_ERR(REFIT_ERR_MPI, "nccl transport: broadcast of the id");
  REFIT_CHECK(refit_mpi_request_wait(&req, deadline,
                                     "nccl transport: broadcast of the id"));
  if (!msg.ok)
    return st != REFIT_OK ? st
                          : REFIT_ERR(REFIT_ERR_PEER, "nccl transport: rank 0 could "
                                                      "not create the NCCL unique id");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  c->comm = NULL;
  c->aborted = 0;
  ncclResult_t res =
      ncclCommInitRankConfig(&c->comm, c->size, msg.id, c->rank, &config);
  if (res != ncclSuccess && res != ncclInProgress) {
    st = refit_nccl_error(res, c->comm, "ncclCommInitRankConfig", __FILE__, __LINE__);
    refit_nccl_abort(c);
    return st;
  }
  REFIT_CHECK(refit_nccl_settle(c, deadline, "ncclCommInitRankConfig"));
  REFIT_INFO("nccl transport: communicator of %d ranks ready", c->size);
  return REFIT_OK;
}

static refit_status_t refit_nccl_create(const refit_transport_args_t *args,
                                        void **out) {
  refit_status_t st = REFIT_OK;
  refit_nccl_ctx_t *c = calloc(1, sizeof(*c));
  if (c == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "nccl transport: context");
  c->timeout_s = args->timeout_s;
  c->rank = args->world_rank;
  c->size = args->world_size;
  c->world = args->world;
  REFIT_CHECK_GOTO(refit_device_stream_create(&c->stream), st, err);
  REFIT_CHECK_GOTO(refit_nccl_connect(c, MPI_Wtime() + args->timeout_s), st, err);
  *out = c;
  return REFIT_OK;

err:
  refit_nccl_destroy(c);
  return st;
}

static int refit_nccl_healthy(void *ctx) {
  const refit_nccl_ctx_t *c = ctx;
  return !c->aborted;
}

/* After a failed refit every rank replaces its communicator: one aborted on
 * any rank cannot serve the others, and aborting a healthy one also ends
 * kernels still waiting on the failed exchange. */
static refit_status_t refit_nccl_recover(void *ctx, double deadline) {
  refit_nccl_ctx_t *c = ctx;
  const int was_aborted = c->aborted;
  if (c->comm != NULL && !c->aborted) {
    ncclCommAbort(c->comm);
    c->aborted = 1;
  }
  cudaError_t err = cudaStreamSynchronize(c->stream);
  if (err != cudaSuccess)
    return refit_cuda_error(err, "cudaStreamSynchronize (nccl recover)", __FILE__,
                            __LINE__);
  REFIT_CHECK(refit_nccl_connect(c, deadline));
  REFIT_INFO("nccl transport: new communicator after the failed refit%s",
             was_aborted ? " (this rank's was aborted)" : "");
  return REFIT_OK;
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
    .healthy = refit_nccl_healthy,
    .recover = refit_nccl_recover,
};

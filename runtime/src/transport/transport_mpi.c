/*
 * MPI transport over host memory: one non-blocking send or receive per
 * message, all messages of a bucket in flight at once, completed with
 * MPI_Testsome against a deadline so that a dead peer is an error, not a hang.
 *
 * After a failed exchange this rank's communicator may hold messages of
 * that refit (an eager send whose receive was cancelled, a drain's sends to
 * a peer that gave up) which a later refit's receive with a reused tag would
 * match. So a failed or abandoned exchange marks the transport unhealthy,
 * and the next begin repairs it on every rank: each replaces its
 * communicator with a fresh duplicate, where nothing of the old refit can
 * arrive (as the IPC and NCCL transports start clean).
 */
#include "transport/transport.h"

#include "mpi/outlive.h"

#include "core/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct refit_exchange {
  int n;
  int nsends;
  MPI_Request *req;
  int *peer;
  int *indices;
  size_t *bytes; /* expected size (or, with got, the most) of each message */
  size_t **got;  /* receives of variable length: where the length goes */
  MPI_Status *status;
};

typedef struct {
  MPI_Comm comm;
  int dirty; /* an exchange failed or was abandoned since the last repair */
} refit_mpi_ctx_t;

static refit_status_t refit_mpi_check(int rc, const char *what, int peer) {
  if (rc == MPI_SUCCESS)
    return REFIT_OK;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return REFIT_ERR(REFIT_ERR_MPI, "%s with peer rank %d failed: %s", what, peer,
                   msg);
}

static refit_status_t refit_mpi_query(const refit_transport_args_t *args) {
  (void)args;
  return REFIT_OK;
}

/* Per pair: any two ranks whose buffers are in host memory. */
static int refit_mpi_can_connect(const refit_pair_facts_t *pair) {
  return pair->memory == REFIT_MEMORY_HOST;
}

static refit_status_t refit_mpi_create(const refit_transport_args_t *args,
                                       void **ctx) {
  refit_mpi_ctx_t *c = calloc(1, sizeof(*c));
  if (c == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "mpi transport: context");
  /* A private communicator keeps our tags away from the caller's traffic;
   * errors are returned to us rather than aborting the job. */
  MPI_Request req;
  refit_status_t st = refit_mpi_startup(MPI_Comm_idup(args->world, &c->comm, &req), &req,
                                        MPI_Wtime() + args->timeout_s,
                                        "mpi transport: duplicating the communicator");
  if (st != REFIT_OK) {
    if (st != REFIT_ERR_TIMEOUT)
      free(c); /* on a timeout MPI may still write c->comm: kept */
    return st;
  }
  MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
  *ctx = c;
  return REFIT_OK;
}

static void refit_mpi_exchange_free(refit_exchange_t *ex) {
  if (ex == NULL)
    return;
  free(ex->req);
  free(ex->peer);
  free(ex->indices);
  free(ex->bytes);
  free(ex->status);
  free(ex->got);
  free(ex);
}

static refit_status_t refit_mpi_start(void *ctx, const refit_xfer_t *sends,
                                      int nsends, const refit_xfer_t *recvs,
                                      int nrecvs, int tag,
                                      refit_exchange_t **out) {
  refit_mpi_ctx_t *c = ctx;
  refit_status_t st = REFIT_OK;
  refit_exchange_t *ex = calloc(1, sizeof(*ex));
  int n = nsends + nrecvs;

  if (ex == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "mpi transport: exchange");
  ex->req = malloc((size_t)(n ? n : 1) * sizeof(*ex->req));
  ex->peer = malloc((size_t)(n ? n : 1) * sizeof(*ex->peer));
  ex->indices = malloc((size_t)(n ? n : 1) * sizeof(*ex->indices));
  ex->bytes = malloc((size_t)(n ? n : 1) * sizeof(*ex->bytes));
  ex->status = malloc((size_t)(n ? n : 1) * sizeof(*ex->status));
  ex->got = calloc((size_t)(n ? n : 1), sizeof(*ex->got));
  if (ex->req == NULL || ex->peer == NULL || ex->indices == NULL || ex->bytes == NULL ||
      ex->status == NULL || ex->got == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "mpi transport: %d requests", n);
    goto err;
  }
  /* Receives first so that eager sends find them posted. */
  for (int i = 0; i < nrecvs; i++) {
    if (recvs[i].bytes > (size_t)INT32_MAX) {
      st = REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "mpi transport: message of %zu bytes from rank %d exceeds "
                     "2 GiB; lower refit.bucket_bytes",
                     recvs[i].bytes, recvs[i].peer);
      goto err;
    }
    ex->peer[ex->n] = recvs[i].peer;
    ex->bytes[ex->n] = recvs[i].bytes;
    ex->got[ex->n] = recvs[i].got;
    REFIT_CHECK_GOTO(refit_mpi_check(MPI_Irecv(recvs[i].buf, (int)recvs[i].bytes,
                                               MPI_BYTE, recvs[i].peer, tag,
                                               c->comm, &ex->req[ex->n]),
                                     "MPI_Irecv", recvs[i].peer),
                     st, err);
    ex->n++;
  }
  for (int i = 0; i < nsends; i++) {
    if (sends[i].bytes > (size_t)INT32_MAX) {
      st = REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "mpi transport: message of %zu bytes to rank %d exceeds "
                     "2 GiB; lower refit.bucket_bytes",
                     sends[i].bytes, sends[i].peer);
      goto err;
    }
    ex->peer[ex->n] = sends[i].peer;
    ex->bytes[ex->n] = sends[i].bytes;
    REFIT_CHECK_GOTO(refit_mpi_check(MPI_Isend(sends[i].buf, (int)sends[i].bytes,
                                               MPI_BYTE, sends[i].peer, tag,
                                               c->comm, &ex->req[ex->n]),
                                     "MPI_Isend", sends[i].peer),
                     st, err);
    ex->n++;
    ex->nsends++;
  }
  *out = ex;
  return REFIT_OK;

err:
  /* Requests already posted cannot be taken back safely once a peer may be
   * gone; cancel receives, leave the rest to MPI_Finalize or abort. */
  for (int i = 0; i < ex->n; i++)
    if (ex->req[i] != MPI_REQUEST_NULL)
      MPI_Cancel(&ex->req[i]);
  refit_mpi_exchange_free(ex);
  return st;
}

static void refit_mpi_abandon(void *ctx, refit_exchange_t *ex);

/* One MPI_Testsome pass: *progressed = messages completed by it. A receive
 * that got fewer bytes than the plan says is a truncated message, not a short
 * bucket: the first such is recorded in *bad (the others keep completing, so
 * that no request outlives the exchange). */
static refit_status_t refit_mpi_poll(refit_exchange_t *ex, const char *phase,
                                     int *progressed, refit_status_t *bad) {
  int outcount = 0;
  int rc = MPI_Testsome(ex->n, ex->req, &outcount, ex->indices, ex->status);
  *progressed = 0;
  if (rc != MPI_SUCCESS)
    return refit_mpi_check(rc, phase, -1);
  if (outcount == MPI_UNDEFINED)
    return REFIT_OK;
  for (int k = 0; k < outcount; k++) {
    const int i = ex->indices[k];
    int count = 0;
    if (i >= ex->n - ex->nsends || *bad != REFIT_OK)
      continue;
    MPI_Get_count(&ex->status[k], MPI_BYTE, &count);
    if (ex->got[i] != NULL) /* at most bytes: MPI refuses a longer message */
      *ex->got[i] = (size_t)count;
    else if ((size_t)count != ex->bytes[i])
      *bad = REFIT_ERR(REFIT_ERR_INTEGRITY,
                       "%s: truncated message from rank %d: expected %zu bytes, "
                       "got %d",
                       phase, ex->peer[i], ex->bytes[i], count);
  }
  *progressed = outcount;
  return REFIT_OK;
}

static int refit_mpi_pending(const refit_exchange_t *ex) {
  int n = 0;
  for (int i = 0; i < ex->n; i++)
    n += ex->req[i] != MPI_REQUEST_NULL;
  return n;
}

static refit_status_t refit_mpi_wait(void *ctx, refit_exchange_t *ex,
                                     double deadline, const char *phase) {
  unsigned spins = 0;
  refit_status_t bad = REFIT_OK;
  int left;

  while ((left = refit_mpi_pending(ex)) > 0) {
    int progressed = 0;
    refit_status_t st = refit_mpi_poll(ex, phase, &progressed, &bad);
    if (st != REFIT_OK) {
      refit_mpi_abandon(ctx, ex);
      return st;
    }
    if (progressed > 0) {
      spins = 0; /* a message completed: the next may be close behind */
      continue;
    }
    if (MPI_Wtime() > deadline) {
      char peers[256] = "";
      size_t used = 0;
      for (int i = 0; i < ex->n && used + 16 < sizeof(peers); i++)
        if (ex->req[i] != MPI_REQUEST_NULL)
          used += (size_t)snprintf(peers + used, sizeof(peers) - used, "%s%s %d",
                                   used ? ", " : "",
                                   i < ex->n - ex->nsends ? "from" : "to",
                                   ex->peer[i]);
      st = REFIT_ERR(REFIT_ERR_TIMEOUT,
                     "%s: %d of %d messages still outstanding at the deadline "
                     "(peer ranks: %s)",
                     phase, left, ex->n, peers);
      /* Outstanding requests are cancelled or released, never waited on. */
      refit_mpi_abandon(ctx, ex);
      return st;
    }
    refit_poll_nap(&spins);
  }
  refit_mpi_exchange_free(ex);
  if (bad != REFIT_OK)
    ((refit_mpi_ctx_t *)ctx)->dirty = 1;
  return bad;
}

/* wait() without blocking: one poll; frees the exchange when complete. */
static refit_status_t refit_mpi_test(void *ctx, refit_exchange_t *ex, int *done) {
  refit_status_t bad = REFIT_OK;
  int progressed = 0;
  *done = 0;
  refit_status_t st = refit_mpi_poll(ex, "test", &progressed, &bad);
  if (st != REFIT_OK) {
    refit_mpi_abandon(ctx, ex);
    return st;
  }
  if (refit_mpi_pending(ex) > 0 && bad == REFIT_OK)
    return REFIT_OK;
  if (refit_mpi_pending(ex) > 0) {
    /* A truncated message: finish the rest so no request outlives the
     * exchange, and report the truncation (its message is already set). */
    (void)refit_mpi_wait(ctx, ex, MPI_Wtime() + 60, "after a truncated message");
    *done = 1;
    return bad;
  }
  refit_mpi_exchange_free(ex);
  *done = 1;
  return bad;
}

static void refit_mpi_abandon(void *ctx, refit_exchange_t *ex) {
  ((refit_mpi_ctx_t *)ctx)->dirty = 1;
  for (int i = 0; i < ex->n; i++) {
    if (ex->req[i] == MPI_REQUEST_NULL)
      continue;
    if (i < ex->n - ex->nsends) {
      /* Receives: cancel, and complete the cancellation when MPI can. A
       * receive already matched to a message of a dead peer can neither
       * finish nor be cancelled: waiting on it would hang, so after a short
       * grace it is released (MPI_Request_free). Nothing keeps its staging
       * aside: should MPI still complete it, it writes into staging that the
       * next refit reuses (or that keep_staging: false gave back); the
       * repair at the next begin replaces the communicator, which stops new
       * matches, not this one. */
      int done = 0;
      MPI_Cancel(&ex->req[i]);
      for (int k = 0; k < 2000 && !done; k++) {
        MPI_Test(&ex->req[i], &done, MPI_STATUS_IGNORE);
        if (!done) {
          struct timespec ts = {0, 50000};
          nanosleep(&ts, NULL);
        }
      }
      if (!done)
        MPI_Request_free(&ex->req[i]);
    } else {
      /* Sends to a dead peer may never complete: let MPI finish or drop
       * them in the background. */
      MPI_Request_free(&ex->req[i]);
    }
  }
  refit_mpi_exchange_free(ex);
}

static int refit_mpi_healthy(void *ctx) { return !((refit_mpi_ctx_t *)ctx)->dirty; }

/* Collective over every rank: a fresh communicator, the old one released
 * (MPI frees it once what is still pending on it is done). */
static refit_status_t refit_mpi_recover(void *ctx, double deadline) {
  refit_mpi_ctx_t *c = ctx;
  /* On the heap: a duplicate that misses its deadline is written later. */
  MPI_Comm *fresh = malloc(sizeof(*fresh));
  MPI_Request req;
  if (fresh == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "mpi transport repair");
  *fresh = MPI_COMM_NULL;
  int rc = MPI_Comm_idup(c->comm, fresh, &req);
  if (rc != MPI_SUCCESS) {
    free(fresh);
    return refit_mpi_check(rc, "mpi transport repair: MPI_Comm_idup", -1);
  }
  void *blocks[] = {fresh};
  REFIT_CHECK(refit_outlive_wait(&req, deadline, "mpi transport repair", blocks, 1));
  MPI_Comm_set_errhandler(*fresh, MPI_ERRORS_RETURN);
  MPI_Comm_free(&c->comm);
  c->comm = *fresh;
  free(fresh);
  c->dirty = 0;
  return REFIT_OK;
}

static void refit_mpi_destroy(void *ctx) {
  refit_mpi_ctx_t *c = ctx;
  if (c == NULL)
    return;
  MPI_Comm_free(&c->comm);
  free(c);
}

/* Opened the same way whichever pairs the per-pair choice gave it. */
static refit_status_t refit_mpi_create_pairs(const refit_transport_args_t *args,
                                             const refit_pair_locality_t *loc, void **ctx) {
  (void)loc;
  return refit_mpi_create(args, ctx);
}

const refit_transport_ops_t refit_transport_mpi = {
    .name = "mpi",
    .kind = REFIT_TRANSPORT_MPI,
    .variable_length = 1,
    .query = refit_mpi_query,
    .create = refit_mpi_create,
    .can_connect = refit_mpi_can_connect,
    .create_pairs = refit_mpi_create_pairs,
    .start = refit_mpi_start,
    .wait = refit_mpi_wait,
    .test = refit_mpi_test,
    .abandon = refit_mpi_abandon,
    .healthy = refit_mpi_healthy,
    .recover = refit_mpi_recover,
    .destroy = refit_mpi_destroy,
    .register_buffer = refit_transport_register_none,
};

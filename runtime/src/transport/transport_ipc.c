/*
 * IPC transport over device memory of one node: the sender copies straight
 * into the receiver's registered buffer with cudaMemcpyAsync (peer copies on
 * the copy engines; a plain device copy when both ranks use one GPU).
 *
 * Set-up, once: every receive buffer is registered collectively
 * (register_buffer); its cudaIpcMemHandle, with the offset of the buffer in
 * its allocation and its size, is allgathered over MPI. A sender opens a
 * peer's handle the first time it copies into it (cudaIpcOpenMemHandle) and
 * keeps the mapping until destroy, so refits after the first open nothing.
 *
 * Per exchange, two small MPI messages per message, on private
 * communicators so that tags never collide:
 *   receiver -> sender  "ready": registered buffer index, offset, bytes. The
 *                       receiver posts it in start(), so the sender never
 *                       writes into a staging area that is still being
 *                       unpacked (double buffering).
 *   sender -> receiver  "done": sent once the copy's event has completed, so
 *                       a finished wait() on the receiver means the bytes
 *                       are in its memory. It carries the sender's length:
 *                       a receive of variable length (refit_xfer_t.got)
 *                       takes any length up to its own, others only their
 *                       own.
 * Progress is made in start() and wait(); wait() polls MPI requests and CUDA
 * events against the deadline and names the peers still outstanding when it
 * passes. After a failure the transport refuses further use until
 * recover(), which every rank enters at the next begin.
 *
 * Ordering: the transport's stream is non-blocking, so the caller makes the
 * send buffers complete before start() (synchronizes the stream that wrote
 * them); after a successful wait() the received bytes are complete for any
 * stream.
 */
#include "device/device.h"
#include "transport/transport.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One registered buffer of one rank, as every rank sees it. */
typedef struct {
  cudaIpcMemHandle_t handle;
  uint64_t offset; /* of the registered pointer within its allocation */
  uint64_t bytes;  /* 0: the rank registered nothing in this round */
} refit_ipc_desc_t;

typedef struct {
  int32_t index; /* registered buffer of the receiver */
  int32_t pad;
  uint64_t offset; /* within that buffer */
  uint64_t bytes;
} refit_ipc_ready_t;

typedef struct {
  refit_ipc_desc_t desc;
  void *mapped; /* base of the opened allocation, NULL until first use */
  int owns;     /* this entry opened the mapping (others may share it) */
} refit_ipc_remote_t;

typedef struct {
  MPI_Comm ready_comm, done_comm;
  cudaStream_t stream;
  int rank, size;
  int nregs;               /* registration rounds so far */
  void **local;            /* [nregs] this rank's registered pointers */
  refit_ipc_remote_t *rem; /* [nregs * size]: round k of rank r at k*size+r */
  int broken;
  double timeout_s;        /* bounds each start-up collective */
} refit_ipc_ctx_t;

enum { IPC_WAIT_READY, IPC_COPYING, IPC_SENDING_DONE, IPC_FINISHED };

struct refit_exchange {
  int nsends, nrecvs;
  int tag;
  /* Sends: the ready message in, the copy, the done message out. */
  const void **src;
  size_t *src_bytes;
  int *send_peer;
  int *state;
  refit_ipc_ready_t *ready_in;
  MPI_Request *ready_req;
  cudaEvent_t *copied;
  MPI_Request *done_send_req;
  /* Receives: the ready message out, the done message in. */
  int *recv_peer;
  refit_ipc_ready_t *ready_out;
  MPI_Request *ready_send_req;
  uint64_t *done_in;
  MPI_Request *done_recv_req;
  size_t **got; /* refit_xfer_t.got of each receive (NULL: exact length) */
};

static refit_status_t refit_ipc_mpi(int rc, const char *what, int peer) {
  if (rc == MPI_SUCCESS)
    return REFIT_OK;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return REFIT_ERR(REFIT_ERR_MPI, "ipc transport: %s with peer rank %d: %s",
                   what, peer, msg);
}

static refit_status_t refit_ipc_query(const refit_transport_args_t *args) {
  refit_device_locality_t loc;
  REFIT_CHECK(refit_device_locality(args->world, args->timeout_s, &loc));
  refit_status_t st = REFIT_OK;
  if (loc.nnodes > 1)
    st = REFIT_ERR(REFIT_ERR_CONFIG,
                   "ipc transport: the %d ranks run on %d nodes; CUDA IPC "
                   "reaches only GPUs of one node: use refit.transport nccl",
                   loc.size, loc.nnodes);
  refit_device_locality_free(&loc);
  return st;
}

/* Per pair: two ranks of one node with device memory (a node being a GPU
 * under refit.locality: gpu, where ranks of two GPUs go to NCCL). */
static int refit_ipc_can_connect(const refit_pair_facts_t *pair) {
  return pair->memory == REFIT_MEMORY_DEVICE && pair->same_node;
}

static void refit_ipc_destroy(void *ctx);

static refit_status_t refit_ipc_create(const refit_transport_args_t *args,
                                       void **out) {
  refit_status_t st = REFIT_OK;
  refit_ipc_ctx_t *c = calloc(1, sizeof(*c));
  if (c == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "ipc transport: context");
  c->rank = args->world_rank;
  c->size = args->world_size;
  c->ready_comm = c->done_comm = MPI_COMM_NULL;
  c->timeout_s = args->timeout_s;
  const double deadline = MPI_Wtime() + args->timeout_s;
  MPI_Request req;
  st = refit_mpi_startup(MPI_Comm_idup(args->world, &c->ready_comm, &req), &req, deadline,
                         "ipc transport: duplicating the communicator");
  if (st == REFIT_OK)
    st = refit_mpi_startup(MPI_Comm_idup(args->world, &c->done_comm, &req), &req,
                           deadline, "ipc transport: duplicating the communicator");
  if (st == REFIT_ERR_TIMEOUT)
    return st; /* MPI may still write the context: kept */
  if (st != REFIT_OK)
    goto err;
  MPI_Comm_set_errhandler(c->ready_comm, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(c->done_comm, MPI_ERRORS_RETURN);
  REFIT_CHECK_GOTO(refit_device_stream_create(&c->stream), st, err);
  *out = c;
  return REFIT_OK;

err:
  refit_ipc_destroy(c);
  return st;
}

static refit_status_t refit_ipc_register(void *ctx, void *ptr, size_t bytes) {
  refit_ipc_ctx_t *c = ctx;
  refit_status_t st = REFIT_OK;
  refit_ipc_desc_t mine;
  memset(&mine, 0, sizeof(mine));

  /* Describe the local buffer; a failure still enters the allgather so the
   * other ranks do not wait for this one, and is agreed on below. */
  if (ptr != NULL && bytes > 0) {
    void *base = NULL;
    size_t size = 0;
    st = refit_device_alloc_range(ptr, &base, &size);
    if (st == REFIT_OK &&
        (uintptr_t)ptr - (uintptr_t)base + bytes > size)
      st = REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "ipc transport: registering %zu bytes at %p overruns its "
                     "allocation of %zu bytes at %p",
                     bytes, ptr, size, base);
    if (st == REFIT_OK) {
      cudaError_t err = cudaIpcGetMemHandle(&mine.handle, base);
      if (err != cudaSuccess)
        st = refit_cuda_error(err, "cudaIpcGetMemHandle", __FILE__, __LINE__);
    }
    if (st == REFIT_OK) {
      mine.offset = (uint64_t)((uintptr_t)ptr - (uintptr_t)base);
      mine.bytes = bytes;
    }
  }
  void **local = realloc(c->local, (size_t)(c->nregs + 1) * sizeof(*local));
  refit_ipc_remote_t *rem =
      realloc(c->rem, (size_t)(c->nregs + 1) * (size_t)c->size * sizeof(*rem));
  if (local != NULL)
    c->local = local;
  if (rem != NULL)
    c->rem = rem;
  /* Everyone's descriptors, then mine, then the agreement's two ints: one
   * buffer that outlives a missed deadline (MPI may still write it; kept
   * then). Bounded by refit.timeout_s: a dead peer is an error, not a hang. */
  const size_t desc_bytes = ((size_t)c->size + 1) * sizeof(refit_ipc_desc_t);
  unsigned char *buf = calloc(1, desc_bytes + 2 * sizeof(int));
  if (buf == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "ipc transport: registration of %d ranks",
                     c->size);
  refit_ipc_desc_t *descs = (refit_ipc_desc_t *)buf;
  int *agree = (int *)(buf + desc_bytes);
  descs[c->size] = mine;
  const double deadline = MPI_Wtime() + c->timeout_s;
  MPI_Request req;
  refit_status_t wst = refit_mpi_startup(
      MPI_Iallgather(&descs[c->size], (int)sizeof(mine), MPI_BYTE, descs,
                     (int)sizeof(mine), MPI_BYTE, c->ready_comm, &req),
      &req, deadline, "ipc transport: gathering IPC handles");
  agree[0] = wst == REFIT_OK && st == REFIT_OK && local != NULL && rem != NULL;
  if (wst == REFIT_OK)
    wst = refit_mpi_startup(
        MPI_Iallreduce(&agree[0], &agree[1], 1, MPI_INT, MPI_MIN, c->ready_comm, &req),
        &req, deadline, "ipc transport: agreeing on the registration");
  if (wst != REFIT_OK) {
    c->broken = 1;
    if (wst != REFIT_ERR_TIMEOUT)
      free(buf);
    return wst;
  }
  const int all_ok = agree[1];
  if (!all_ok) {
    free(buf);
    if (st == REFIT_OK)
      st = (local == NULL || rem == NULL)
               ? REFIT_ERR(REFIT_ERR_NO_MEMORY, "ipc transport: registration")
               : REFIT_ERR(REFIT_ERR_PEER, "ipc transport: another rank failed "
                                           "to register its buffer");
    return st;
  }
  c->local[c->nregs] = ptr;
  for (int r = 0; r < c->size; r++) {
    refit_ipc_remote_t *x = &c->rem[(size_t)c->nregs * (size_t)c->size + (size_t)r];
    x->desc = descs[r];
    x->mapped = NULL;
    x->owns = 0;
  }
  free(buf);
  REFIT_INFO("ipc transport: registered buffer %d: %zu bytes at %p", c->nregs,
             bytes, ptr);
  c->nregs++;
  return REFIT_OK;
}

/* The registered buffer of this rank holding [buf, buf + bytes). */
static refit_status_t refit_ipc_find_local(refit_ipc_ctx_t *c, const void *buf,
                                           size_t bytes, int peer,
                                           refit_ipc_ready_t *ready) {
  for (int k = 0; k < c->nregs; k++) {
    const refit_ipc_desc_t *d = &c->rem[(size_t)k * (size_t)c->size + (size_t)c->rank].desc;
    uintptr_t lo = (uintptr_t)c->local[k], p = (uintptr_t)buf;
    if (d->bytes == 0 || p < lo || p + bytes > lo + d->bytes)
      continue;
    ready->index = k;
    ready->pad = 0;
    ready->offset = (uint64_t)(p - lo);
    ready->bytes = bytes;
    return REFIT_OK;
  }
  return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                   "ipc transport: receive of %zu bytes from rank %d at %p lies "
                   "in no registered buffer (register staging buffers with "
                   "refit_transport_register after opening the transport)",
                   bytes, peer, buf);
}

/* The address in this process of the peer's registered buffer described by
 * `ready`, opening its handle on first use. */
static refit_status_t refit_ipc_target(refit_ipc_ctx_t *c, int peer,
                                       const refit_ipc_ready_t *ready,
                                       void **dst) {
  if (ready->index < 0 || ready->index >= c->nregs)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "ipc transport: rank %d names registered buffer %d, but "
                     "%d were registered",
                     peer, ready->index, c->nregs);
  refit_ipc_remote_t *x =
      &c->rem[(size_t)ready->index * (size_t)c->size + (size_t)peer];
  if (ready->offset + ready->bytes > x->desc.bytes)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "ipc transport: rank %d asks for bytes %llu..%llu of its "
                     "buffer %d of %llu bytes",
                     peer, (unsigned long long)ready->offset,
                     (unsigned long long)(ready->offset + ready->bytes),
                     ready->index, (unsigned long long)x->desc.bytes);
  if (peer == c->rank) {
    /* A process cannot open its own handle; it needs no mapping either. */
    *dst = (char *)c->local[ready->index] + ready->offset;
    return REFIT_OK;
  }
  /* Two registered buffers of one peer may share an allocation (both
   * staging areas carved from one cudaMalloc): map it once. */
  for (int k = 0; k < c->nregs && x->mapped == NULL; k++) {
    const refit_ipc_remote_t *y = &c->rem[(size_t)k * (size_t)c->size + (size_t)peer];
    if (y->mapped != NULL &&
        memcmp(&y->desc.handle, &x->desc.handle, sizeof(x->desc.handle)) == 0)
      x->mapped = y->mapped;
  }
  if (x->mapped == NULL) {
    cudaError_t err = cudaIpcOpenMemHandle(&x->mapped, x->desc.handle,
                                           cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      x->mapped = NULL;
      refit_cuda_error(err, "cudaIpcOpenMemHandle", __FILE__, __LINE__);
      return REFIT_ERR(REFIT_ERR_CUDA,
                       "ipc transport: opening buffer %d of rank %d: %s (%s)",
                       ready->index, peer, cudaGetErrorName(err),
                       cudaGetErrorString(err));
    }
    x->owns = 1;
    REFIT_INFO("ipc transport: opened buffer %d of rank %d", ready->index,
               peer);
  }
  *dst = (char *)x->mapped + x->desc.offset + ready->offset;
  return REFIT_OK;
}

static void refit_ipc_exchange_free(refit_exchange_t *ex) {
  if (ex == NULL)
    return;
  if (ex->copied != NULL)
    for (int i = 0; i < ex->nsends; i++)
      refit_device_event_destroy(ex->copied[i]);
  free(ex->src);
  free(ex->src_bytes);
  free(ex->send_peer);
  free(ex->state);
  free(ex->ready_in);
  free(ex->ready_req);
  free(ex->copied);
  free(ex->done_send_req);
  free(ex->recv_peer);
  free(ex->ready_out);
  free(ex->ready_send_req);
  free(ex->done_in);
  free(ex->got);
  free(ex->done_recv_req);
  free(ex);
}

/* Cancel what may never complete (receives from a peer that is gone) and
 * release the requests, so the exchange can be freed. */
static void refit_ipc_exchange_drop(refit_exchange_t *ex) {
  MPI_Request *lists[] = {ex->ready_req, ex->done_recv_req};
  int counts[] = {ex->nsends, ex->nrecvs};
  for (int l = 0; l < 2; l++)
    for (int i = 0; i < counts[l]; i++)
      if (lists[l] != NULL && lists[l][i] != MPI_REQUEST_NULL) {
        MPI_Cancel(&lists[l][i]);
        MPI_Request_free(&lists[l][i]);
      }
  MPI_Request *sends[] = {ex->done_send_req, ex->ready_send_req};
  for (int l = 0; l < 2; l++)
    for (int i = 0; i < counts[l]; i++)
      if (sends[l] != NULL && sends[l][i] != MPI_REQUEST_NULL)
        MPI_Request_free(&sends[l][i]);
}

/* Advance every message of `ex` as far as it goes without blocking; *left
 * receives the number not yet finished. */
static refit_status_t refit_ipc_progress(refit_ipc_ctx_t *c,
                                         refit_exchange_t *ex, int *left) {
  const int tag = ex->tag;
  int n = 0;
  for (int i = 0; i < ex->nsends; i++) {
    const int peer = ex->send_peer[i];
    int flag = 0;
    if (ex->state[i] == IPC_WAIT_READY) {
      REFIT_CHECK(refit_ipc_mpi(MPI_Test(&ex->ready_req[i], &flag,
                                         MPI_STATUS_IGNORE),
                                "MPI_Test(ready)", peer));
      if (flag) {
        void *dst = NULL;
        REFIT_CHECK(refit_ipc_target(c, peer, &ex->ready_in[i], &dst));
        /* A size other than the receiver's is the receiver's to report (the
         * done message carries the sender's size): copy no more than it
         * asked for. */
        const size_t n_copy = ex->src_bytes[i] < ex->ready_in[i].bytes
                                  ? ex->src_bytes[i]
                                  : (size_t)ex->ready_in[i].bytes;
        if (n_copy > 0)
          REFIT_CUDA_CHECK(cudaMemcpyAsync(dst, ex->src[i], n_copy,
                                           cudaMemcpyDefault, c->stream));
        REFIT_CUDA_CHECK(cudaEventRecord(ex->copied[i], c->stream));
        ex->state[i] = IPC_COPYING;
      }
    }
    if (ex->state[i] == IPC_COPYING) {
      int done = 0;
      REFIT_CHECK(refit_device_event_done(ex->copied[i], &done));
      if (done) {
        REFIT_CHECK(refit_ipc_mpi(MPI_Isend(&ex->src_bytes[i], 1,
                                            MPI_UINT64_T, peer, tag,
                                            c->done_comm,
                                            &ex->done_send_req[i]),
                                  "MPI_Isend(done)", peer));
        ex->state[i] = IPC_SENDING_DONE;
      }
    }
    if (ex->state[i] == IPC_SENDING_DONE) {
      REFIT_CHECK(refit_ipc_mpi(MPI_Test(&ex->done_send_req[i], &flag,
                                         MPI_STATUS_IGNORE),
                                "MPI_Test(done)", peer));
      if (flag)
        ex->state[i] = IPC_FINISHED;
    }
    n += ex->state[i] != IPC_FINISHED;
  }
  for (int i = 0; i < ex->nrecvs; i++) {
    const int peer = ex->recv_peer[i];
    int flag = 0;
    if (ex->ready_send_req[i] != MPI_REQUEST_NULL)
      REFIT_CHECK(refit_ipc_mpi(MPI_Test(&ex->ready_send_req[i], &flag,
                                         MPI_STATUS_IGNORE),
                                "MPI_Test(ready)", peer));
    if (ex->done_recv_req[i] != MPI_REQUEST_NULL) {
      REFIT_CHECK(refit_ipc_mpi(MPI_Test(&ex->done_recv_req[i], &flag,
                                         MPI_STATUS_IGNORE),
                                "MPI_Test(done)", peer));
      /* A variable-length receive takes any length up to its own (the
       * sender copied that many bytes). */
      if (flag && ex->got[i] != NULL && ex->done_in[i] <= ex->ready_out[i].bytes)
        *ex->got[i] = (size_t)ex->done_in[i];
      else if (flag && ex->done_in[i] != ex->ready_out[i].bytes)
        return REFIT_ERR(REFIT_ERR_INTEGRITY,
                         "ipc transport: %s message from rank %d: it sent %llu "
                         "bytes, %llu expected (do all ranks run the same plan?)",
                         ex->done_in[i] < ex->ready_out[i].bytes ? "truncated"
                                                                 : "oversized",
                         peer, (unsigned long long)ex->done_in[i],
                         (unsigned long long)ex->ready_out[i].bytes);
    }
    n += ex->ready_send_req[i] != MPI_REQUEST_NULL ||
         ex->done_recv_req[i] != MPI_REQUEST_NULL;
  }
  *left = n;
  return REFIT_OK;
}

/* A failed exchange: its requests are dropped and it is freed; copies
 * already queued may still land and the peers' state is unknown, so the
 * transport takes no further work until recover(). Returns st. */
static refit_status_t refit_ipc_fail(refit_ipc_ctx_t *c, refit_exchange_t *ex,
                                     refit_status_t st) {
  c->broken = 1;
  refit_ipc_exchange_drop(ex);
  refit_ipc_exchange_free(ex);
  return st;
}

#define IPC_ALLOC(field, count)                                                \
  ((ex->field = calloc((size_t)((count) ? (count) : 1), sizeof(*ex->field))) != NULL)

static refit_status_t refit_ipc_start(void *ctx, const refit_xfer_t *sends,
                                      int nsends, const refit_xfer_t *recvs,
                                      int nrecvs, int tag,
                                      refit_exchange_t **out) {
  refit_ipc_ctx_t *c = ctx;
  refit_status_t st = REFIT_OK;
  int left = 0;

  if (c->broken)
    return REFIT_ERR(REFIT_ERR_STATE, "ipc transport: refused after an earlier "
                                      "failure");
  refit_exchange_t *ex = calloc(1, sizeof(*ex));
  if (ex == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "ipc transport: exchange");
  if (!(IPC_ALLOC(src, nsends) && IPC_ALLOC(src_bytes, nsends) &&
        IPC_ALLOC(send_peer, nsends) && IPC_ALLOC(state, nsends) &&
        IPC_ALLOC(ready_in, nsends) && IPC_ALLOC(ready_req, nsends) &&
        IPC_ALLOC(copied, nsends) && IPC_ALLOC(done_send_req, nsends) &&
        IPC_ALLOC(recv_peer, nrecvs) && IPC_ALLOC(ready_out, nrecvs) &&
        IPC_ALLOC(ready_send_req, nrecvs) && IPC_ALLOC(done_in, nrecvs) &&
        IPC_ALLOC(done_recv_req, nrecvs) && IPC_ALLOC(got, nrecvs))) {
    refit_ipc_exchange_free(ex);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "ipc transport: exchange of %d",
                     nsends + nrecvs);
  }
  ex->tag = tag;
  for (int i = 0; i < nsends; i++) {
    ex->ready_req[i] = ex->done_send_req[i] = MPI_REQUEST_NULL;
    ex->src[i] = sends[i].buf;
    ex->src_bytes[i] = sends[i].bytes;
    ex->send_peer[i] = sends[i].peer;
    ex->state[i] = IPC_WAIT_READY;
  }
  for (int i = 0; i < nrecvs; i++) {
    ex->ready_send_req[i] = ex->done_recv_req[i] = MPI_REQUEST_NULL;
    ex->recv_peer[i] = recvs[i].peer;
    ex->got[i] = recvs[i].got;
  }
  /* Set ex->nsends/nrecvs only as requests exist, so cleanup sees the
   * right ones. */
  for (int i = 0; i < nsends; i++) {
    REFIT_CHECK_GOTO(refit_device_event_create(&ex->copied[i]), st, err);
    ex->nsends++;
    REFIT_CHECK_GOTO(refit_ipc_mpi(MPI_Irecv(&ex->ready_in[i],
                                             (int)sizeof(refit_ipc_ready_t),
                                             MPI_BYTE, sends[i].peer, tag,
                                             c->ready_comm, &ex->ready_req[i]),
                                   "MPI_Irecv(ready)", sends[i].peer),
                     st, err);
  }
  for (int i = 0; i < nrecvs; i++) {
    REFIT_CHECK_GOTO(refit_ipc_find_local(c, recvs[i].buf, recvs[i].bytes,
                                          recvs[i].peer, &ex->ready_out[i]),
                     st, err);
    ex->nrecvs++;
    REFIT_CHECK_GOTO(
        refit_ipc_mpi(MPI_Irecv(&ex->done_in[i], 1, MPI_UINT64_T, recvs[i].peer,
                                tag, c->done_comm, &ex->done_recv_req[i]),
                      "MPI_Irecv(done)", recvs[i].peer),
        st, err);
    REFIT_CHECK_GOTO(refit_ipc_mpi(MPI_Isend(&ex->ready_out[i],
                                             (int)sizeof(refit_ipc_ready_t),
                                             MPI_BYTE, recvs[i].peer, tag,
                                             c->ready_comm,
                                             &ex->ready_send_req[i]),
                                   "MPI_Isend(ready)", recvs[i].peer),
                     st, err);
  }
  /* Copies whose peer is already ready start now, overlapping the caller. */
  REFIT_CHECK_GOTO(refit_ipc_progress(c, ex, &left), st, err);
  *out = ex;
  return REFIT_OK;

err:
  return refit_ipc_fail(c, ex, st);
}

static refit_status_t refit_ipc_wait(void *ctx, refit_exchange_t *ex,
                                     double deadline, const char *phase) {
  refit_ipc_ctx_t *c = ctx;
  refit_status_t st = REFIT_OK;
  unsigned spins = 0;
  int left = 1;

  if (c->broken) {
    st = REFIT_ERR(REFIT_ERR_STATE,
                   "%s: ipc transport: refused after an earlier failure",
                   phase);
    goto fail;
  }
  for (int before = -1;; before = left) {
    REFIT_CHECK_GOTO(refit_ipc_progress(c, ex, &left), st, fail);
    if (left == 0)
      break;
    if (before >= 0 && left < before)
      spins = 0; /* a message completed: the next may be close behind */
    if (MPI_Wtime() > deadline) {
      char peers[256] = "";
      size_t used = 0;
      for (int i = 0; i < ex->nrecvs && used + 24 < sizeof(peers); i++)
        if (ex->done_recv_req[i] != MPI_REQUEST_NULL ||
            ex->ready_send_req[i] != MPI_REQUEST_NULL)
          used += (size_t)snprintf(peers + used, sizeof(peers) - used,
                                   "%sfrom %d", used ? ", " : "",
                                   ex->recv_peer[i]);
      for (int i = 0; i < ex->nsends && used + 24 < sizeof(peers); i++)
        if (ex->state[i] != IPC_FINISHED)
          used += (size_t)snprintf(
              peers + used, sizeof(peers) - used, "%sto %d (%s)",
              used ? ", " : "", ex->send_peer[i],
              ex->state[i] == IPC_WAIT_READY ? "never ready"
              : ex->state[i] == IPC_COPYING  ? "copying"
                                             : "done unsent");
      st = REFIT_ERR(REFIT_ERR_TIMEOUT,
                     "%s: ipc transport: %d of %d messages still outstanding "
                     "at the deadline (peer ranks: %s)",
                     phase, left, ex->nsends + ex->nrecvs, peers);
      goto fail;
    }
    refit_poll_nap(&spins);
  }
  refit_ipc_exchange_free(ex);
  return REFIT_OK;

fail:
  return refit_ipc_fail(c, ex, st);
}

static refit_status_t refit_ipc_test(void *ctx, refit_exchange_t *ex, int *done) {
  refit_ipc_ctx_t *c = ctx;
  int left = 1;
  refit_status_t st = c->broken ? REFIT_ERR(REFIT_ERR_STATE,
                                            "ipc transport: refused after an "
                                            "earlier failure")
                                : refit_ipc_progress(c, ex, &left);
  *done = 0;
  if (st != REFIT_OK) {
    return refit_ipc_fail(c, ex, st);
  }
  if (left == 0) {
    refit_ipc_exchange_free(ex);
    *done = 1;
  }
  return REFIT_OK;
}

static int refit_ipc_healthy(void *ctx) {
  const refit_ipc_ctx_t *c = ctx;
  return !c->broken;
}

/* Receive and discard every message already delivered on `comm`: the ready
 * and done messages of exchanges dropped after a failure. */
static refit_status_t refit_ipc_discard(MPI_Comm comm) {
  for (;;) {
    int flag = 0, count = 0;
    MPI_Status status;
    int rc = MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, &status);
    if (rc != MPI_SUCCESS)
      return refit_ipc_mpi(rc, "MPI_Iprobe(stale)", -1);
    if (!flag)
      return REFIT_OK;
    MPI_Get_count(&status, MPI_BYTE, &count);
    unsigned char sink[64];
    if (count < 0 || (size_t)count > sizeof(sink))
      return REFIT_ERR(REFIT_ERR_INTERNAL,
                       "ipc transport: stale message of %d bytes from rank %d",
                       count, status.MPI_SOURCE);
    rc = MPI_Recv(sink, count, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, comm,
                  MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
      return refit_ipc_mpi(rc, "MPI_Recv(stale)", status.MPI_SOURCE);
  }
}

/* After a failed refit: wait for this rank's copies into its peers, then
 * (1) a barrier, after which no rank has a copy of the failed refit left in
 * flight and every message of it has been sent, (2) discard those messages,
 * (3) a barrier, so that no rank starts a new exchange while another still
 * discards. Leftovers that arrive later carry the failed attempt's tags,
 * which the next seven refits do not use. Mappings and registrations stay. */
static refit_status_t refit_ipc_recover(void *ctx, double deadline) {
  refit_ipc_ctx_t *c = ctx;
  MPI_Request req = MPI_REQUEST_NULL;
  if (c->stream != NULL) {
    cudaError_t err = cudaStreamSynchronize(c->stream);
    if (err != cudaSuccess)
      return refit_cuda_error(err, "cudaStreamSynchronize (ipc recover)",
                              __FILE__, __LINE__);
  }
  REFIT_CHECK(refit_ipc_mpi(MPI_Ibarrier(c->ready_comm, &req), "MPI_Ibarrier", -1));
  REFIT_CHECK(refit_mpi_request_wait(&req, deadline, "ipc transport: recovery barrier"));
  REFIT_CHECK(refit_ipc_discard(c->ready_comm));
  REFIT_CHECK(refit_ipc_discard(c->done_comm));
  REFIT_CHECK(refit_ipc_mpi(MPI_Ibarrier(c->done_comm, &req), "MPI_Ibarrier", -1));
  REFIT_CHECK(refit_mpi_request_wait(&req, deadline, "ipc transport: recovery barrier"));
  if (c->broken)
    REFIT_INFO("ipc transport: usable again after the failed refit");
  c->broken = 0;
  return REFIT_OK;
}

static void refit_ipc_destroy(void *ctx) {
  refit_ipc_ctx_t *c = ctx;
  if (c == NULL)
    return;
  /* Let copies into peers finish before their mappings go; after a failure
   * nothing waits here (the caller is on its way to an error exit). */
  if (c->stream != NULL && !c->broken)
    cudaStreamSynchronize(c->stream);
  if (c->rem != NULL)
    for (size_t i = 0; i < (size_t)c->nregs * (size_t)c->size; i++)
      if (c->rem[i].mapped != NULL && c->rem[i].owns)
        cudaIpcCloseMemHandle(c->rem[i].mapped);
  free(c->rem);
  free(c->local);
  refit_device_stream_destroy(c->stream);
  if (c->ready_comm != MPI_COMM_NULL)
    MPI_Comm_free(&c->ready_comm);
  if (c->done_comm != MPI_COMM_NULL)
    MPI_Comm_free(&c->done_comm);
  free(c);
}

/* IPC cannot cancel: copies a peer started, and its notices, may still come.
 * A wait whose deadline has passed drops the exchange and leaves the
 * transport to its repair. */
static void refit_ipc_abandon(void *ctx, refit_exchange_t *ex) {
  (void)refit_ipc_wait(ctx, ex, MPI_Wtime() - 1, "abandoned");
}

/* Opened the same way whichever pairs the per-pair choice gave it. */
static refit_status_t refit_ipc_create_pairs(const refit_transport_args_t *args,
                                             const refit_pair_locality_t *loc, void **ctx) {
  (void)loc;
  return refit_ipc_create(args, ctx);
}

const refit_transport_ops_t refit_transport_ipc = {
    .name = "ipc",
    .kind = REFIT_TRANSPORT_IPC,
    .memory = REFIT_MEMORY_DEVICE,
    .variable_length = 1,
    .registers_buffers = 1,
    .query = refit_ipc_query,
    .create = refit_ipc_create,
    .can_connect = refit_ipc_can_connect,
    .create_pairs = refit_ipc_create_pairs,
    .start = refit_ipc_start,
    .wait = refit_ipc_wait,
    .test = refit_ipc_test,
    .abandon = refit_ipc_abandon,
    .destroy = refit_ipc_destroy,
    .register_buffer = refit_ipc_register,
    .healthy = refit_ipc_healthy,
    .recover = refit_ipc_recover,
};

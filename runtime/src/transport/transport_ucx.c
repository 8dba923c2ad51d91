/*
 * UCX transport over host or device memory (refit.transport: ucx). For host
 * memory auto never picks it (MPI comes first); for device memory auto
 * reaches it after IPC and NCCL. Device memory needs a UCX built with CUDA
 * (cuda_copy, cuda_ipc): query() asks the UCP context for the memory types
 * it moves and refuses the job, naming the UCX version and the remedies,
 * when CUDA is not among them. Buffers are passed to UCX as they are, with
 * their memory type, so UCX picks its CUDA transports (copy engines through
 * cuda_ipc on one node, GPUDirect RDMA or pipelined staging across nodes).
 *
 * One UCP context and one worker per rank; the worker addresses are
 * exchanged over MPI (allgather, again after a repair) and endpoints are
 * created on first use,
 * in peer error-handling mode so that a lost peer fails its operations
 * instead of hanging them. Every message is one tagged send/receive: the
 * 64-bit tag holds the bucket tag (high half) and the sender's world rank
 * (low half), matched exactly. wait() progresses the worker until every
 * request of the exchange completes or the deadline passes; then the
 * remaining requests are cancelled and REFIT_ERR_TIMEOUT names their peers.
 *
 * After a failed exchange UCX may still hold a receive it could not cancel
 * (matched to a message whose data has not all arrived), which would write
 * into staging that the next refit reuses, and messages of the failed refit
 * may wait in the worker's queues. So a failed or abandoned exchange marks
 * the transport unhealthy, and the next begin repairs it on every rank
 * (recover): each closes its endpoints and destroys its worker (nothing of
 * the old worker writes any buffer after that), creates a new one and
 * exchanges its address again. A rank learns the new addresses only once
 * every rank has destroyed its old worker, so nothing of the failed refit
 * can reach a new one.
 */
#include "transport/transport.h"

#include "mpi/outlive.h"

#include "core/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

/* Translate a UCX status into refit's, naming the call and the peer. */
static refit_status_t refit_ucx_error(ucs_status_t status, const char *call,
                                      int peer, const char *file, int line) {
  REFIT_WARN("%s:%d: %s (peer rank %d): %s", file, line, call, peer,
             ucs_status_string(status));
  return REFIT_ERR(REFIT_ERR_UCX, "ucx transport: %s with peer rank %d failed: %s",
                   call, peer, ucs_status_string(status));
}

#define REFIT_UCX_CHECK_GOTO(call, peer, status_var, label)                    \
  do {                                                                         \
    ucs_status_t ucx_status_ = (call);                                         \
    if (ucx_status_ != UCS_OK) {                                               \
      (status_var) =                                                           \
          refit_ucx_error(ucx_status_, #call, (peer), __FILE__, __LINE__);     \
      goto label;                                                              \
    }                                                                          \
  } while (0)

typedef struct refit_ucx_ctx refit_ucx_ctx_t;

typedef struct {
  refit_ucx_ctx_t *ctx;
  int rank;
  ucp_ep_h ep;
  ucs_status_t failed; /* set by the error handler: peer lost */
} refit_ucx_peer_t;

struct refit_ucx_ctx {
  int rank, size;
  MPI_Comm world;             /* the session's: recover() exchanges addresses on it */
  ucs_memory_type_t mem_type; /* of every buffer of start() */
  ucp_context_h context;
  ucp_worker_h worker;
  /* Every rank's worker address, concatenated at addr_off[r], addr_len[r]
   * bytes; lens: the allgather's buffers, [0..size) every rank's length,
   * [size] this rank's (on the heap: they outlive a missed deadline). */
  unsigned char *addrs;
  int *addr_off, *addr_len, *lens;
  int dirty;   /* an exchange failed or was abandoned since the last repair */
  int closing; /* endpoints closed on purpose: their errors are not losses */
  refit_ucx_peer_t *peers;
  /* Requests of exchanges that ended with them still pending (a send to a
   * peer that gave up, a receive UCX could not cancel yet): never freed
   * while UCX may still touch them; released once complete, or by the
   * forced close of their endpoints at the end. */
  void **zombies;
  int nzombies, zombies_cap;
};

typedef struct {
  void *req;  /* NULL once complete */
  int peer;
  int is_send;
  size_t bytes;
  size_t *got; /* a receive of variable length: where its length goes */
} refit_ucx_op_t;

struct refit_exchange {
  int n, left;
  refit_ucx_op_t *ops;
};

static uint64_t refit_ucx_tag(int tag, int sender) {
  return ((uint64_t)(uint32_t)tag << 32) | (uint32_t)sender;
}

static void refit_ucx_peer_failed(void *arg, ucp_ep_h ep, ucs_status_t status) {
  refit_ucx_peer_t *p = arg;
  (void)ep;
  if (p->ctx->closing)
    return;
  p->failed = status;
  REFIT_WARN("ucx transport: lost peer rank %d: %s", p->rank,
             ucs_status_string(status));
}

/* Does this rank's UCX move CUDA device memory? */
static refit_status_t refit_ucx_moves_cuda(int *yes) {
  ucp_config_t *config = NULL;
  ucp_context_h context = NULL;
  ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                         .features = UCP_FEATURE_TAG};
  ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
  refit_status_t st = REFIT_OK;
  *yes = 0;
  REFIT_UCX_CHECK_GOTO(ucp_config_read(NULL, NULL, &config), -1, st, out);
  REFIT_UCX_CHECK_GOTO(ucp_init(&params, config, &context), -1, st, out);
  REFIT_UCX_CHECK_GOTO(ucp_context_query(context, &attr), -1, st, out);
  *yes = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
out:
  if (context != NULL)
    ucp_cleanup(context);
  if (config != NULL)
    ucp_config_release(config);
  return st;
}

/* Host memory: always. Device memory: only when every rank's UCX moves CUDA
 * memory (agreed over the world, so every rank gets the same answer). */
static refit_status_t refit_ucx_query(const refit_transport_args_t *args) {
  if (args->memory != REFIT_MEMORY_DEVICE)
    return REFIT_OK;
  /* The reduction's buffers outlive a missed deadline (MPI may still write
   * them): on the heap, kept then. */
  int *v = malloc(2 * sizeof(int));
  if (v == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "ucx transport: query");
  v[0] = v[1] = 0;
  refit_status_t st = refit_ucx_moves_cuda(&v[0]);
  MPI_Request req;
  refit_status_t wst = refit_mpi_startup(
      MPI_Iallreduce(&v[0], &v[1], 1, MPI_INT, MPI_MIN, args->world, &req), &req,
      MPI_Wtime() + args->timeout_s, "ucx transport: agreeing on CUDA support");
  if (wst != REFIT_OK) {
    if (wst != REFIT_ERR_TIMEOUT)
      free(v);
    return wst;
  }
  const int mine = v[0], all = v[1];
  free(v);
  if (all)
    return REFIT_OK;
  if (st != REFIT_OK)
    return st;
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  return REFIT_ERR(REFIT_ERR_CONFIG,
                   "ucx transport: the job's buffers are in GPU memory, but %s "
                   "UCX (libucp %u.%u.%u) has no CUDA transports; use a UCX built "
                   "--with-cuda (launch/build-ucx-cuda.sh builds one), or "
                   "refit.transport nccl or ipc, or refit.device_map: none to "
                   "refit through host memory",
                   mine ? "another rank's" : "this rank's", major, minor, release);
}

/* Per pair: host memory only. Whether UCX moves device memory is known only
 * by asking every rank's UCP context (query(), collective), which a pair's
 * facts cannot tell. */
static int refit_ucx_can_connect(const refit_pair_facts_t *pair) {
  return pair->memory == REFIT_MEMORY_HOST;
}

static void refit_ucx_destroy(void *vctx);

/* A new worker for this rank and every rank's address, collectively over
 * c->world by `deadline`. The allgathers' buffers are heap blocks that stay
 * with MPI when a peer misses the deadline (outlive.h); the addresses in
 * use are replaced only on success. */
static refit_status_t refit_ucx_worker_open(refit_ucx_ctx_t *c, double deadline) {
  refit_status_t st = REFIT_OK;
  ucp_address_t *uaddr = NULL;
  size_t uaddr_len = 0;
  unsigned char *mine = NULL, *addrs = NULL;
  /* [0, size): every rank's length; [size]: this rank's; then the offsets. */
  int *lens = malloc((size_t)(2 * c->size + 1) * sizeof(int));
  if (lens == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "ucx transport: %d peers", c->size);
  ucp_worker_params_t wparams = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                                 .thread_mode = UCS_THREAD_MODE_SINGLE};
  REFIT_UCX_CHECK_GOTO(ucp_worker_create(c->context, &wparams, &c->worker), -1, st, out);
  REFIT_UCX_CHECK_GOTO(ucp_worker_get_address(c->worker, &uaddr, &uaddr_len), -1, st,
                       out);
  /* A copy of our own: MPI may read it after a missed deadline. */
  mine = malloc(uaddr_len ? uaddr_len : 1);
  if (mine == NULL || uaddr_len > (size_t)INT32_MAX) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "ucx transport: worker address of %zu bytes",
                   uaddr_len);
    goto out;
  }
  memcpy(mine, uaddr, uaddr_len);
  ucp_worker_release_address(c->worker, uaddr);
  uaddr = NULL;

  /* Every rank's address: lengths, then the bytes. */
  int *off = lens + c->size + 1;
  MPI_Request req;
  lens[c->size] = (int)uaddr_len;
  if (MPI_Iallgather(&lens[c->size], 1, MPI_INT, lens, 1, MPI_INT, c->world, &req) !=
      MPI_SUCCESS) {
    st = REFIT_ERR(REFIT_ERR_MPI, "ucx transport: allgather of address lengths");
    goto out;
  }
  {
    void *blocks[] = {lens, mine};
    st = refit_outlive_wait(&req, deadline, "ucx transport: allgather of address lengths",
                            blocks, 2);
  }
  if (st != REFIT_OK) {
    lens = NULL, mine = NULL; /* MPI's now */
    goto out;
  }
  int total = 0;
  for (int r = 0; r < c->size; r++) {
    off[r] = total;
    total += lens[r];
  }
  addrs = malloc((size_t)(total ? total : 1));
  if (addrs == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "ucx transport: %d address bytes", total);
    goto out;
  }
  if (MPI_Iallgatherv(mine, lens[c->size], MPI_BYTE, addrs, lens, off, MPI_BYTE, c->world,
                      &req) != MPI_SUCCESS) {
    st = REFIT_ERR(REFIT_ERR_MPI, "ucx transport: allgather of worker addresses");
    goto out;
  }
  {
    void *blocks[] = {lens, mine, addrs};
    st = refit_outlive_wait(&req, deadline,
                            "ucx transport: allgather of worker addresses", blocks, 3);
  }
  if (st != REFIT_OK) {
    lens = NULL, mine = NULL, addrs = NULL; /* MPI's now */
    goto out;
  }
  free(c->addrs);
  free(c->lens);
  c->addrs = addrs;
  c->lens = lens;
  c->addr_len = lens;
  c->addr_off = off;
  addrs = NULL;
  lens = NULL;
out:
  if (uaddr != NULL)
    ucp_worker_release_address(c->worker, uaddr);
  free(mine);
  free(addrs);
  free(lens);
  return st;
}

static refit_status_t refit_ucx_create(const refit_transport_args_t *args, void **out) {
  refit_status_t st = REFIT_OK;
  ucp_config_t *config = NULL;
  refit_ucx_ctx_t *c = calloc(1, sizeof(*c));
  if (c == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "ucx transport: context");
  c->rank = args->world_rank;
  c->size = args->world_size;
  c->world = args->world;
  c->mem_type =
      args->memory == REFIT_MEMORY_DEVICE ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
  c->peers = calloc((size_t)c->size, sizeof(*c->peers));
  if (c->peers == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "ucx transport: %d peers", c->size);
    goto err_free;
  }
  for (int r = 0; r < c->size; r++) {
    c->peers[r].ctx = c;
    c->peers[r].rank = r;
    c->peers[r].failed = UCS_OK;
  }

  ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                         .features = UCP_FEATURE_TAG};
  REFIT_UCX_CHECK_GOTO(ucp_config_read(NULL, NULL, &config), -1, st, err_free);
  REFIT_UCX_CHECK_GOTO(ucp_init(&params, config, &c->context), -1, st, err_config);
  ucp_config_release(config);
  config = NULL;
  /* Bounded by refit.timeout_s: a peer that died in start-up is an error,
   * not a hang. */
  REFIT_CHECK_GOTO(refit_ucx_worker_open(c, MPI_Wtime() + args->timeout_s), st, err_free);
  *out = c;
  return REFIT_OK;

err_config:
  ucp_config_release(config);
err_free:
  refit_ucx_destroy(c);
  return st;
}

static refit_status_t refit_ucx_ep(refit_ucx_ctx_t *c, int peer, ucp_ep_h *ep) {
  refit_status_t st = REFIT_OK;
  if (peer < 0 || peer >= c->size)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "ucx transport: peer rank %d outside the world of %d", peer,
                     c->size);
  refit_ucx_peer_t *p = &c->peers[peer];
  if (p->failed != UCS_OK)
    return REFIT_ERR(REFIT_ERR_UCX, "ucx transport: peer rank %d was lost: %s",
                     peer, ucs_status_string(p->failed));
  if (p->ep == NULL) {
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)(c->addrs + c->addr_off[peer]),
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = refit_ucx_peer_failed, .arg = p}};
    REFIT_UCX_CHECK_GOTO(ucp_ep_create(c->worker, &ep, &p->ep), peer, st, out);
  }
  *ep = p->ep;
out:
  return st;
}

/* Release the zombies that have completed. */
static void refit_ucx_reap(refit_ucx_ctx_t *c) {
  int k = 0;
  for (int i = 0; i < c->nzombies; i++) {
    if (ucp_request_check_status(c->zombies[i]) == UCS_INPROGRESS)
      c->zombies[k++] = c->zombies[i];
    else
      ucp_request_free(c->zombies[i]);
  }
  c->nzombies = k;
}

static void refit_ucx_exchange_free(refit_ucx_ctx_t *c, refit_exchange_t *ex) {
  if (ex == NULL)
    return;
  /* Cancel what is still pending and let UCX finish it before freeing;
   * what it cannot finish makes the transport need a repair. */
  for (int i = 0; i < ex->n; i++)
    if (ex->ops[i].req != NULL) {
      c->dirty = 1;
      ucp_request_cancel(c->worker, ex->ops[i].req);
    }
  for (int spins = 0; spins < 100000; spins++) {
    int pending = 0;
    ucp_worker_progress(c->worker);
    for (int i = 0; i < ex->n; i++) {
      if (ex->ops[i].req == NULL)
        continue;
      if (ucp_request_check_status(ex->ops[i].req) == UCS_INPROGRESS) {
        pending++;
        continue;
      }
      ucp_request_free(ex->ops[i].req);
      ex->ops[i].req = NULL;
    }
    if (pending == 0)
      break;
  }
  for (int i = 0; i < ex->n; i++) {
    if (ex->ops[i].req == NULL)
      continue;
    if (c->nzombies == c->zombies_cap) {
      int cap = c->zombies_cap ? 2 * c->zombies_cap : 64;
      void **z = realloc(c->zombies, (size_t)cap * sizeof(*z));
      if (z == NULL)
        continue; /* leaked, never freed under UCX: the safe side */
      c->zombies = z;
      c->zombies_cap = cap;
    }
    c->zombies[c->nzombies++] = ex->ops[i].req;
  }
  free(ex->ops);
  free(ex);
  refit_ucx_reap(c);
}

static refit_status_t refit_ucx_start(void *vctx, const refit_xfer_t *sends,
                                      int nsends, const refit_xfer_t *recvs,
                                      int nrecvs, int tag,
                                      refit_exchange_t **out) {
  refit_ucx_ctx_t *c = vctx;
  refit_status_t st = REFIT_OK;
  refit_exchange_t *ex = calloc(1, sizeof(*ex));
  const int n = nsends + nrecvs;
  ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE,
                            .memory_type = c->mem_type};

  if (ex == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "ucx transport: exchange");
  ex->ops = calloc((size_t)(n ? n : 1), sizeof(*ex->ops));
  if (ex->ops == NULL) {
    free(ex);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "ucx transport: %d requests", n);
  }
  /* Receives first so that sends to this rank find them posted. */
  for (int i = 0; i < nrecvs; i++) {
    refit_ucx_op_t *op = &ex->ops[ex->n];
    ucp_ep_h ep;
    /* An endpoint to the sender too, so that its loss is noticed. */
    REFIT_CHECK_GOTO(refit_ucx_ep(c, recvs[i].peer, &ep), st, err);
    /* Always a request, so that every receive's length is checked in one
     * place (refit_ucx_poll). */
    ucp_request_param_t rrp = {.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL |
                                               UCP_OP_ATTR_FIELD_MEMORY_TYPE,
                               .memory_type = c->mem_type};
    ucs_status_ptr_t r = ucp_tag_recv_nbx(c->worker, recvs[i].buf, recvs[i].bytes,
                                          refit_ucx_tag(tag, recvs[i].peer),
                                          UINT64_MAX, &rrp);
    if (UCS_PTR_IS_ERR(r)) {
      st = refit_ucx_error(UCS_PTR_STATUS(r), "ucp_tag_recv_nbx", recvs[i].peer,
                           __FILE__, __LINE__);
      goto err;
    }
    op->req = r;
    op->peer = recvs[i].peer;
    op->bytes = recvs[i].bytes;
    op->got = recvs[i].got;
    ex->n++;
    ex->left += r != NULL;
  }
  for (int i = 0; i < nsends; i++) {
    refit_ucx_op_t *op = &ex->ops[ex->n];
    ucp_ep_h ep;
    REFIT_CHECK_GOTO(refit_ucx_ep(c, sends[i].peer, &ep), st, err);
    ucs_status_ptr_t r = ucp_tag_send_nbx(ep, sends[i].buf, sends[i].bytes,
                                          refit_ucx_tag(tag, c->rank), &rp);
    if (UCS_PTR_IS_ERR(r)) {
      st = refit_ucx_error(UCS_PTR_STATUS(r), "ucp_tag_send_nbx", sends[i].peer,
                           __FILE__, __LINE__);
      goto err;
    }
    op->req = r;
    op->peer = sends[i].peer;
    op->is_send = 1;
    op->bytes = sends[i].bytes;
    ex->n++;
    ex->left += r != NULL;
  }
  *out = ex;
  return REFIT_OK;

err:
  c->dirty = 1;
  refit_ucx_exchange_free(c, ex);
  return st;
}

/* Check one pending request; completes it (frees the request) when done. */
static refit_status_t refit_ucx_poll(refit_ucx_ctx_t *c, refit_exchange_t *ex,
                                     refit_ucx_op_t *op, const char *phase) {
  ucs_status_t s;
  ucp_tag_recv_info_t info = {0};
  if (op->is_send)
    s = ucp_request_check_status(op->req);
  else
    s = ucp_tag_recv_request_test(op->req, &info);
  if (s == UCS_INPROGRESS) {
    if (c->peers[op->peer].failed != UCS_OK)
      return REFIT_ERR(REFIT_ERR_UCX, "%s: peer rank %d was lost: %s", phase,
                       op->peer, ucs_status_string(c->peers[op->peer].failed));
    return REFIT_OK;
  }
  ucp_request_free(op->req);
  op->req = NULL;
  ex->left--;
  if (s != UCS_OK)
    return REFIT_ERR(REFIT_ERR_UCX, "%s: %s %s rank %d failed: %s", phase,
                     op->is_send ? "send" : "receive",
                     op->is_send ? "to" : "from", op->peer, ucs_status_string(s));
  if (!op->is_send && op->got != NULL) /* at most bytes: UCX refuses longer */
    *op->got = info.length;
  else if (!op->is_send && info.length != op->bytes)
    return REFIT_ERR(REFIT_ERR_UCX,
                     "%s: message from rank %d has %zu bytes, expected %zu "
                     "(do all ranks run the same plan?)",
                     phase, op->peer, info.length, op->bytes);
  return REFIT_OK;
}

static refit_status_t refit_ucx_wait(void *vctx, refit_exchange_t *ex,
                                     double deadline, const char *phase) {
  refit_ucx_ctx_t *c = vctx;
  refit_status_t st = REFIT_OK;
  unsigned idle = 0;

  while (ex->left > 0 && st == REFIT_OK) {
    const unsigned progressed = ucp_worker_progress(c->worker);
    const int before = ex->left;
    for (int i = 0; i < ex->n && st == REFIT_OK; i++)
      if (ex->ops[i].req != NULL)
        st = refit_ucx_poll(c, ex, &ex->ops[i], phase);
    if (st != REFIT_OK || ex->left == 0)
      break;
    if (progressed == 0 && ex->left == before) {
      if (MPI_Wtime() > deadline) {
        char peers[256] = "";
        size_t used = 0;
        for (int i = 0; i < ex->n && used + 16 < sizeof(peers); i++)
          if (ex->ops[i].req != NULL)
            used += (size_t)snprintf(peers + used, sizeof(peers) - used, "%s%s %d",
                                     used ? ", " : "",
                                     ex->ops[i].is_send ? "to" : "from",
                                     ex->ops[i].peer);
        st = REFIT_ERR(REFIT_ERR_TIMEOUT,
                       "%s: %d of %d messages still outstanding at the deadline "
                       "(peer ranks: %s)",
                       phase, ex->left, ex->n, peers);
        break;
      }
      refit_poll_nap(&idle);
    } else {
      idle = 0;
    }
  }
  if (st != REFIT_OK)
    c->dirty = 1;
  refit_ucx_exchange_free(c, ex);
  return st;
}

/* wait() without blocking: one progress pass and one poll of every
 * operation; frees the exchange once complete or failed (its pending
 * requests become zombies, never freed under UCX). */
static refit_status_t refit_ucx_test(void *vctx, refit_exchange_t *ex, int *done) {
  refit_ucx_ctx_t *c = vctx;
  refit_status_t st = REFIT_OK;
  *done = 0;
  ucp_worker_progress(c->worker);
  for (int i = 0; i < ex->n && st == REFIT_OK; i++)
    if (ex->ops[i].req != NULL)
      st = refit_ucx_poll(c, ex, &ex->ops[i], "ucx transport: test");
  if (st != REFIT_OK)
    c->dirty = 1;
  if (st != REFIT_OK || ex->left == 0) {
    refit_ucx_exchange_free(c, ex);
    *done = 1;
  }
  return st;
}

/* Give up an exchange: receives cancelled, what UCX still holds kept. */
static void refit_ucx_abandon(void *vctx, refit_exchange_t *ex) {
  ((refit_ucx_ctx_t *)vctx)->dirty = 1;
  refit_ucx_exchange_free(vctx, ex);
}

/* Close every endpoint, bounded (forced when `force` or when operations are
 * still pending: a flush would wait for peers that may never answer), and
 * destroy the worker: UCX touches no buffer of this rank for it after, and
 * whatever it still held (zombies, queued messages) goes with it. */
static void refit_ucx_worker_close(refit_ucx_ctx_t *c, int force) {
  if (c->worker == NULL)
    return;
  c->closing = 1;
  if (c->peers != NULL) {
    /* Close every endpoint together, bounded: a peer that is gone must not
     * hold up the exit. */
    void **reqs = calloc((size_t)c->size, sizeof(void *));
    refit_ucx_reap(c);
    force |= c->nzombies > 0;
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE |
                                              (force ? UCP_OP_ATTR_FIELD_FLAGS : 0),
                              .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0,
                              .memory_type = c->mem_type};
    for (int r = 0; r < c->size; r++) {
      if (c->peers[r].ep == NULL)
        continue;
      ucs_status_ptr_t q = ucp_ep_close_nbx(c->peers[r].ep, &rp);
      if (reqs != NULL && UCS_PTR_IS_PTR(q))
        reqs[r] = q;
      c->peers[r].ep = NULL;
    }
    const double until = MPI_Wtime() + 10.0;
    for (int left = 1; reqs != NULL && left && MPI_Wtime() < until;) {
      ucp_worker_progress(c->worker);
      left = 0;
      for (int r = 0; r < c->size; r++) {
        if (reqs[r] == NULL)
          continue;
        if (ucp_request_check_status(reqs[r]) == UCS_INPROGRESS) {
          left++;
          continue;
        }
        ucp_request_free(reqs[r]);
        reqs[r] = NULL;
      }
    }
    free(reqs);
    for (int spins = 0; c->nzombies > 0 && spins < 100000; spins++) {
      ucp_worker_progress(c->worker);
      refit_ucx_reap(c);
    }
  }
  /* Requests still pending belong to the worker and end with it. */
  c->nzombies = 0;
  ucp_worker_destroy(c->worker);
  c->worker = NULL;
  c->closing = 0;
}

static int refit_ucx_healthy(void *vctx) { return !((refit_ucx_ctx_t *)vctx)->dirty; }

/* Collective over every rank: each destroys its worker (what the failed
 * refit left in it with it), then a new worker and its address for
 * everyone. No rank learns the new addresses before every rank destroyed
 * its old worker, so nothing of the old refit can reach the new one. */
static refit_status_t refit_ucx_recover(void *vctx, double deadline) {
  refit_ucx_ctx_t *c = vctx;
  refit_ucx_worker_close(c, 1);
  for (int r = 0; r < c->size; r++)
    c->peers[r].failed = UCS_OK;
  REFIT_CHECK(refit_ucx_worker_open(c, deadline));
  c->dirty = 0;
  return REFIT_OK;
}

static void refit_ucx_destroy(void *vctx) {
  refit_ucx_ctx_t *c = vctx;
  if (c == NULL)
    return;
  refit_ucx_worker_close(c, 0);
  free(c->zombies);
  if (c->context != NULL)
    ucp_cleanup(c->context);
  free(c->addrs);
  free(c->lens);
  free(c->peers);
  free(c);
}

/* Opened the same way whichever pairs the per-pair choice gave it. */
static refit_status_t refit_ucx_create_pairs(const refit_transport_args_t *args,
                                             const refit_pair_locality_t *loc, void **ctx) {
  (void)loc;
  return refit_ucx_create(args, ctx);
}

const refit_transport_ops_t refit_transport_ucx = {
    .name = "ucx",
    .kind = REFIT_TRANSPORT_UCX,
    .memory = REFIT_MEMORY_ANY,
    .variable_length = 1,
    .query = refit_ucx_query,
    .create = refit_ucx_create,
    .can_connect = refit_ucx_can_connect,
    .create_pairs = refit_ucx_create_pairs,
    .start = refit_ucx_start,
    .wait = refit_ucx_wait,
    .test = refit_ucx_test,
    .abandon = refit_ucx_abandon,
    .healthy = refit_ucx_healthy,
    .recover = refit_ucx_recover,
    .destroy = refit_ucx_destroy,
    .register_buffer = refit_transport_register_none,
};

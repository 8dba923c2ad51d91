/*
 * Per-pair transport over device memory, `refit.transport: auto` when the
 * ranks span several nodes: each pair of ranks that exchanges bytes is served
 * by its locality.
 *   same node    CUDA IPC (transport_ipc.c): copy-engine copies between the
 *                node's GPUs, a device copy when both ranks use one GPU.
 *   other nodes  NCCL (transport_nccl.c).
 * A node is a host, or one GPU with refit.locality: gpu (then ranks of one
 * GPU use IPC and every other pair NCCL, also on one host: the multi-node
 * path on one machine).
 *
 * NCCL communicators: one over the ranks that exchange across nodes when no
 * two ranks of the job share a GPU. When some do (trainer and generator
 * ranks colocated on the GPUs of several nodes), one communicator per pair
 * {(node a, slot i), (node b, slot j)} that carries bytes, holding the ranks
 * of slot i on node a and of slot j on node b, a rank's slot being its place
 * among the ranks of its GPU: two ranks of different nodes meet in exactly
 * one of them, and none holds two ranks of one GPU, which NCCL does not
 * support.
 *
 * An exchange is split by peer into an IPC exchange and an NCCL exchange,
 * started together and completed together; a failure of either leaves both
 * transports to their own repair (recover) at the next begin.
 */
#include "device.h"
#include "pair_groups.h"
#include "transport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  void *ipc, *nccl; /* nccl NULL when no pair crosses nodes */
  int rank;
  int *node_of; /* [world size] node of each rank under refit.locality */
} refit_pairs_ctx_t;

struct refit_exchange {
  refit_exchange_t *ipc, *nccl; /* NULL: none, or already complete */
};

/* Node of every rank under the configured locality, and whether two ranks
 * share a GPU. */
static refit_status_t refit_pairs_nodes(const refit_transport_args_t *args,
                                        refit_device_locality_t *loc, int **node_of,
                                        int *nnodes) {
  REFIT_CHECK(refit_device_locality(args->world, args->timeout_s, loc));
  *node_of = args->locality == REFIT_LOCALITY_GPU ? loc->gpu_of : loc->node_of;
  *nnodes = args->locality == REFIT_LOCALITY_GPU ? loc->ngpus : loc->nnodes;
  return REFIT_OK;
}

static refit_status_t refit_pairs_query(const refit_transport_args_t *args) {
  refit_device_locality_t loc;
  int *node_of = NULL, nnodes = 0;
  REFIT_CHECK(refit_pairs_nodes(args, &loc, &node_of, &nnodes));
  refit_device_locality_free(&loc);
  if (nnodes <= 1)
    return REFIT_ERR(REFIT_ERR_CONFIG,
                     "ipc+nccl transport: every rank is on one %s, where CUDA "
                     "IPC serves every pair",
                     args->locality == REFIT_LOCALITY_GPU ? "GPU" : "node");
  return REFIT_OK;
}

static void refit_pairs_destroy(void *ctx);

static refit_status_t refit_pairs_create(const refit_transport_args_t *args, void **out) {
  refit_status_t st = REFIT_OK;
  refit_device_locality_t loc = {0};
  int *node_of = NULL, nnodes = 0, ngroups = 0, *begin = NULL, *ranks = NULL;
  refit_pairs_ctx_t *c = calloc(1, sizeof(*c));
  if (c == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "ipc+nccl transport: context");
  c->rank = args->world_rank;
  REFIT_CHECK_GOTO(refit_pairs_nodes(args, &loc, &node_of, &nnodes), st, err);
  c->node_of = malloc((size_t)args->world_size * sizeof(int));
  if (c->node_of == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "ipc+nccl transport: nodes");
    goto err;
  }
  memcpy(c->node_of, node_of, (size_t)args->world_size * sizeof(int));
  /* Every rank computes the same groups from the same pairs and locality;
   * a failure here is the same on every rank (out of memory aside, which the
   * session's agreement after opening reports). */
  REFIT_CHECK_GOTO(refit_pair_groups(args->pairs, args->npairs, args->world_size, node_of,
                                     loc.gpu_of, loc.shared_a >= 0, &ngroups, &begin,
                                     &ranks),
                   st, err);
  REFIT_CHECK_GOTO(refit_transport_ipc.create(args, &c->ipc), st, err);
  if (ngroups > 0) {
    const refit_nccl_groups_t g = {ngroups, begin, ranks};
    REFIT_CHECK_GOTO(refit_nccl_create_groups(args, &g, &c->nccl), st, err);
  }
  REFIT_INFO("ipc+nccl transport: %d nodes (%s), %d NCCL communicator%s for the "
             "pairs across nodes",
             nnodes, args->locality == REFIT_LOCALITY_GPU ? "one per GPU" : "hosts",
             ngroups, ngroups == 1 ? "" : "s");
  free(begin);
  free(ranks);
  refit_device_locality_free(&loc);
  *out = c;
  return REFIT_OK;

err:
  free(begin);
  free(ranks);
  refit_device_locality_free(&loc);
  refit_pairs_destroy(c);
  return st;
}

static void refit_pairs_exchange_free(refit_exchange_t *ex) { free(ex); }

/* Complete what is left of `ex` at once, ignoring the outcome: after a
 * failure `st` of the other half, whose message stays the one reported.
 * Returns st. */
static refit_status_t refit_pairs_drop(refit_pairs_ctx_t *c, refit_exchange_t *ex,
                                       refit_status_t st) {
  char why[1024];
  snprintf(why, sizeof(why), "%s", refit_last_error());
  if (ex->ipc != NULL)
    (void)refit_transport_ipc.wait(c->ipc, ex->ipc, MPI_Wtime() - 1.0,
                                   "ipc+nccl: dropped after a failure");
  if (ex->nccl != NULL)
    (void)refit_transport_nccl.wait(c->nccl, ex->nccl, MPI_Wtime() - 1.0,
                                    "ipc+nccl: dropped after a failure");
  ex->ipc = ex->nccl = NULL;
  refit_pairs_exchange_free(ex);
  return refit_error_set(st, "%s", why);
}

static refit_status_t refit_pairs_start(void *ctx, const refit_xfer_t *sends, int nsends,
                                        const refit_xfer_t *recvs, int nrecvs, int tag,
                                        refit_exchange_t **out) {
  refit_pairs_ctx_t *c = ctx;
  refit_status_t st = REFIT_OK;
  const int n = nsends + nrecvs;
  refit_exchange_t *ex = calloc(1, sizeof(*ex));
  refit_xfer_t *x = malloc((size_t)(n ? n : 1) * sizeof(*x));
  if (ex == NULL || x == NULL) {
    free(ex);
    free(x);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "ipc+nccl transport: exchange of %d", n);
  }
  /* x: local sends, local receives, remote sends, remote receives. */
  const int here = c->node_of[c->rank];
  int ls = 0, lr = 0, rs = 0, rr = 0;
  for (int i = 0; i < nsends; i++)
    ls += c->node_of[sends[i].peer] == here;
  for (int i = 0; i < nrecvs; i++)
    lr += c->node_of[recvs[i].peer] == here;
  refit_xfer_t *l_s = x, *l_r = x + ls, *r_s = x + ls + lr,
               *r_r = x + ls + lr + (nsends - ls);
  ls = lr = 0;
  for (int i = 0; i < nsends; i++) {
    if (c->node_of[sends[i].peer] == here)
      l_s[ls++] = sends[i];
    else
      r_s[rs++] = sends[i];
  }
  for (int i = 0; i < nrecvs; i++) {
    if (c->node_of[recvs[i].peer] == here)
      l_r[lr++] = recvs[i];
    else
      r_r[rr++] = recvs[i];
  }
  if (ls + lr > 0)
    st = refit_transport_ipc.start(c->ipc, l_s, ls, l_r, lr, tag, &ex->ipc);
  if (st == REFIT_OK && rs + rr > 0) {
    if (c->nccl == NULL)
      st = REFIT_ERR(REFIT_ERR_INTERNAL,
                     "ipc+nccl transport: rank %d exchanges with %d ranks of "
                     "other nodes, but its pair list had none",
                     c->rank, rs + rr);
    else
      st = refit_transport_nccl.start(c->nccl, r_s, rs, r_r, rr, tag, &ex->nccl);
  }
  free(x);
  if (st != REFIT_OK) {
    return refit_pairs_drop(c, ex, st);
  }
  *out = ex;
  return REFIT_OK;
}

static refit_status_t refit_pairs_wait(void *ctx, refit_exchange_t *ex, double deadline,
                                       const char *phase) {
  refit_pairs_ctx_t *c = ctx;
  refit_status_t st = REFIT_OK;
  if (ex->ipc != NULL) {
    st = refit_transport_ipc.wait(c->ipc, ex->ipc, deadline, phase);
    ex->ipc = NULL;
  }
  if (st == REFIT_OK && ex->nccl != NULL) {
    st = refit_transport_nccl.wait(c->nccl, ex->nccl, deadline, phase);
    ex->nccl = NULL;
  }
  if (st != REFIT_OK) {
    return refit_pairs_drop(c, ex, st);
  }
  refit_pairs_exchange_free(ex);
  return REFIT_OK;
}

static refit_status_t refit_pairs_test(void *ctx, refit_exchange_t *ex, int *done) {
  refit_pairs_ctx_t *c = ctx;
  refit_status_t st = REFIT_OK;
  int d = 1;
  *done = 0;
  if (ex->ipc != NULL) {
    st = refit_transport_ipc.test(c->ipc, ex->ipc, &d);
    if (st != REFIT_OK || d)
      ex->ipc = NULL; /* freed by test */
  }
  if (st == REFIT_OK && ex->nccl != NULL) {
    st = refit_transport_nccl.test(c->nccl, ex->nccl, &d);
    if (st != REFIT_OK || d)
      ex->nccl = NULL;
  }
  if (st != REFIT_OK) {
    return refit_pairs_drop(c, ex, st);
  }
  if (ex->ipc == NULL && ex->nccl == NULL) {
    refit_pairs_exchange_free(ex);
    *done = 1;
  }
  return REFIT_OK;
}

static refit_status_t refit_pairs_register(void *ctx, void *ptr, size_t bytes) {
  refit_pairs_ctx_t *c = ctx;
  return refit_transport_ipc.register_buffer(c->ipc, ptr, bytes);
}

static int refit_pairs_healthy(void *ctx) {
  refit_pairs_ctx_t *c = ctx;
  return refit_transport_ipc.healthy(c->ipc) &&
         (c->nccl == NULL || refit_transport_nccl.healthy(c->nccl));
}

/* Both halves repair, in the same order on every rank (each is collective
 * over the world). */
static refit_status_t refit_pairs_recover(void *ctx, double deadline) {
  refit_pairs_ctx_t *c = ctx;
  REFIT_CHECK(refit_transport_ipc.recover(c->ipc, deadline));
  if (c->nccl != NULL)
    REFIT_CHECK(refit_transport_nccl.recover(c->nccl, deadline));
  return REFIT_OK;
}

static void refit_pairs_destroy(void *ctx) {
  refit_pairs_ctx_t *c = ctx;
  if (c == NULL)
    return;
  if (c->nccl != NULL)
    refit_transport_nccl.destroy(c->nccl);
  if (c->ipc != NULL)
    refit_transport_ipc.destroy(c->ipc);
  free(c->node_of);
  free(c);
}

const refit_transport_ops_t refit_transport_pairs = {
    .name = "ipc+nccl",
    .kind = REFIT_TRANSPORT_AUTO, /* chosen by auto only */
    .memory = REFIT_MEMORY_DEVICE,
    .query = refit_pairs_query,
    .create = refit_pairs_create,
    .start = refit_pairs_start,
    .wait = refit_pairs_wait,
    .test = refit_pairs_test,
    .destroy = refit_pairs_destroy,
    .register_buffer = refit_pairs_register,
    .healthy = refit_pairs_healthy,
    .recover = refit_pairs_recover,
};

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
#include "transport.h"

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
  REFIT_CHECK(refit_device_locality(args->world, loc));
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
  if (args->pairs == NULL && args->npairs > 0)
    return REFIT_ERR(REFIT_ERR_INTERNAL, "ipc+nccl transport: no pair list");
  return REFIT_OK;
}

static int refit_pairs_cmp_int(const void *a, const void *b) {
  const int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/*
 * The NCCL groups for the cross-node pairs (see the header comment), built
 * from the same pair list on every rank: begin/ranks as refit_nccl_groups_t.
 */
static refit_status_t refit_pairs_groups(const refit_transport_args_t *args,
                                         const refit_device_locality_t *loc,
                                         const int *node_of, int *ngroups_out,
                                         int **begin_out, int **ranks_out) {
  refit_status_t st = REFIT_OK;
  const int n = args->world_size, np = args->npairs;
  int *slot = calloc((size_t)n, sizeof(int));
  int *key = malloc((size_t)(np ? np : 1) * 4 * sizeof(int));
  int *group_of = malloc((size_t)(np ? np : 1) * sizeof(int));
  int *begin = NULL, *ranks = NULL, ngroups = 0;
  if (slot == NULL || key == NULL || group_of == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "ipc+nccl transport: groups of %d pairs", np);
    goto out;
  }
  /* Slot: the rank's place among the ranks of its GPU. */
  for (int r = 0; r < n; r++)
    for (int q = 0; q < r; q++)
      slot[r] += loc->gpu_of[q] == loc->gpu_of[r];
  /* Key of a pair: its two (node, slot), the smaller first, so that both
   * directions of a pair share the group. */
  const int keyed = loc->shared_a >= 0;
  for (int i = 0; i < np; i++) {
    const int s = args->pairs[2 * i], d = args->pairs[2 * i + 1];
    group_of[i] = -1;
    if (node_of[s] == node_of[d])
      continue;
    const int lo = node_of[s] < node_of[d] ? s : d, hi = lo == s ? d : s;
    const int k[4] = {keyed ? node_of[lo] : 0, keyed ? slot[lo] : 0,
                      keyed ? node_of[hi] : 0, keyed ? slot[hi] : 0};
    int g = 0;
    while (g < ngroups && memcmp(&key[4 * g], k, sizeof(k)) != 0)
      g++;
    if (g == ngroups)
      memcpy(&key[4 * ngroups++], k, sizeof(k));
    group_of[i] = g;
  }
  /* Members: the ranks of the pairs of each group, ascending, once each. */
  begin = calloc((size_t)ngroups + 1, sizeof(int));
  ranks = malloc((size_t)(np ? 2 * np : 1) * sizeof(int));
  if (begin == NULL || ranks == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "ipc+nccl transport: %d groups", ngroups);
    goto out;
  }
  int used = 0;
  for (int g = 0; g < ngroups; g++) {
    begin[g] = used;
    for (int i = 0; i < np; i++)
      if (group_of[i] == g) {
        ranks[used++] = args->pairs[2 * i];
        ranks[used++] = args->pairs[2 * i + 1];
      }
    qsort(ranks + begin[g], (size_t)(used - begin[g]), sizeof(int), refit_pairs_cmp_int);
    int w = begin[g];
    for (int i = begin[g]; i < used; i++)
      if (i == begin[g] || ranks[i] != ranks[w - 1])
        ranks[w++] = ranks[i];
    used = w;
    for (int i = begin[g]; i < used; i++)
      for (int j = begin[g]; j < i; j++)
        if (loc->gpu_of[ranks[i]] == loc->gpu_of[ranks[j]]) {
          st = REFIT_ERR(REFIT_ERR_INTERNAL,
                         "ipc+nccl transport: NCCL group %d would hold ranks %d "
                         "and %d of one GPU",
                         g, ranks[j], ranks[i]);
          goto out;
        }
  }
  begin[ngroups] = used;
  *ngroups_out = ngroups;
  *begin_out = begin;
  *ranks_out = ranks;
  begin = ranks = NULL;
out:
  free(slot);
  free(key);
  free(group_of);
  free(begin);
  free(ranks);
  return st;
}

static void refit_pairs_destroy(void *ctx);

static refit_status_t refit_pairs_create(const refit_transport_args_t *args,
                                         void **out) {
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
  REFIT_CHECK_GOTO(refit_pairs_groups(args, &loc, node_of, &ngroups, &begin, &ranks),
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
 * failure of the other half. */
static void refit_pairs_drop(refit_pairs_ctx_t *c, refit_exchange_t *ex) {
  if (ex->ipc != NULL)
    (void)refit_transport_ipc.wait(c->ipc, ex->ipc, MPI_Wtime() - 1.0,
                                   "ipc+nccl: dropped after a failure");
  if (ex->nccl != NULL)
    (void)refit_transport_nccl.wait(c->nccl, ex->nccl, MPI_Wtime() - 1.0,
                                    "ipc+nccl: dropped after a failure");
  ex->ipc = ex->nccl = NULL;
  refit_pairs_exchange_free(ex);
}

static refit_status_t refit_pairs_start(void *ctx, const refit_xfer_t *sends,
                                        int nsends, const refit_xfer_t *recvs,
                                        int nrecvs, int tag,
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
    refit_pairs_drop(c, ex);
    return st;
  }
  *out = ex;
  return REFIT_OK;
}

static refit_status_t refit_pairs_wait(void *ctx, refit_exchange_t *ex,
                                       double deadline, const char *phase) {
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
    refit_pairs_drop(c, ex);
    return st;
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
    refit_pairs_drop(c, ex);
    return st;
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

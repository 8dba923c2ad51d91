/*
 * Per-pair transport over device memory, `refit.transport: auto` when the
 * ranks span several nodes: each pair of ranks that exchanges bytes is served
 * by the first transport of refit_transports[] whose can_connect() accepts
 * the pair's locality (refit_transport_for_pair), which today means
 *   same node    CUDA IPC (transport_ipc.c): copy-engine copies between the
 *                node's GPUs, a device copy when both ranks use one GPU.
 *   other nodes  NCCL (transport_nccl.c).
 * A node is a host, or one GPU with refit.locality: gpu (then ranks of one
 * GPU use IPC and every other pair NCCL, also on one host: the multi-node
 * path on one machine).
 *
 * Opening: every transport the choice can give a pair of device memory
 * (refit_transport_pair_candidates), in table order on every rank. One built
 * for its pairs (create_pairs: NCCL's communicators, pair_groups.h) gets the
 * job's pairs it was given and opens nothing when there are none; one that
 * reaches every rank once set up (IPC) is opened in any case.
 *
 * An exchange is split by peer into one exchange per transport, started
 * together and completed together in table order; a failure of any leaves
 * every transport to its own repair (recover) at the next begin.
 */
#include "device/device.h"
#include "transport/transport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  /* The transports the choice can give a pair, in table order, and their
   * contexts (NULL: opened for no pair). */
  const refit_transport_ops_t *ops[REFIT_TRANSPORTS_MAX];
  void *ctx[REFIT_TRANSPORTS_MAX];
  int n;
  int rank;
  int *via; /* [world size] index into ops of the transport serving each peer */
} refit_pairs_ctx_t;

struct refit_exchange {
  refit_exchange_t *sub[REFIT_TRANSPORTS_MAX]; /* NULL: none, or already complete */
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

/* Index into c->ops of the transport the per-pair choice gives ranks a and
 * b, or -1 when none serves them. */
static int refit_pairs_choose(const refit_pairs_ctx_t *c,
                              const refit_pair_locality_t *loc, refit_memory_t memory,
                              int a, int b) {
  const refit_pair_facts_t f = {.same_node = loc->node_of[a] == loc->node_of[b],
                                .same_gpu = loc->gpu_of[a] == loc->gpu_of[b],
                                .memory = memory};
  const refit_transport_ops_t *ops = refit_transport_for_pair(&f);
  for (int k = 0; k < c->n; k++)
    if (c->ops[k] == ops)
      return k;
  return -1;
}

static void refit_pairs_destroy(void *ctx);

static refit_status_t refit_pairs_create(const refit_transport_args_t *args, void **out) {
  refit_status_t st = REFIT_OK;
  refit_device_locality_t loc = {0};
  int *node_of = NULL, nnodes = 0, *mine = NULL;
  refit_pairs_ctx_t *c = calloc(1, sizeof(*c));
  if (c == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "ipc+nccl transport: context");
  c->rank = args->world_rank;
  REFIT_CHECK_GOTO(refit_pairs_nodes(args, &loc, &node_of, &nnodes), st, err);
  const refit_pair_locality_t where = {node_of, loc.gpu_of, loc.shared_a >= 0};
  c->n = refit_transport_pair_candidates(args->memory, c->ops);
  c->via = malloc((size_t)args->world_size * sizeof(int));
  mine = malloc((size_t)(args->npairs ? 2 * args->npairs : 1) * sizeof(int));
  if (c->via == NULL || mine == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "ipc+nccl transport: nodes");
    goto err;
  }
  for (int r = 0; r < args->world_size; r++)
    c->via[r] = refit_pairs_choose(c, &where, args->memory, c->rank, r);
  for (int i = 0; i < args->npairs; i++)
    if (refit_pairs_choose(c, &where, args->memory, args->pairs[2 * i],
                           args->pairs[2 * i + 1]) < 0) {
      st = REFIT_ERR(REFIT_ERR_CONFIG,
                     "ipc+nccl transport: no transport serves ranks %d and %d",
                     args->pairs[2 * i], args->pairs[2 * i + 1]);
      goto err;
    }
  /* Each transport in table order, with the pairs the choice gave it. */
  for (int k = 0; k < c->n; k++) {
    refit_transport_args_t sub = *args;
    sub.pairs = mine;
    sub.npairs = 0;
    for (int i = 0; i < args->npairs; i++)
      if (refit_pairs_choose(c, &where, args->memory, args->pairs[2 * i],
                             args->pairs[2 * i + 1]) == k) {
        mine[2 * sub.npairs] = args->pairs[2 * i];
        mine[2 * sub.npairs++ + 1] = args->pairs[2 * i + 1];
      }
    REFIT_CHECK_GOTO(refit_transport_check_table(c->ops[k]), st, err);
    REFIT_CHECK_GOTO(c->ops[k]->create_pairs(&sub, &where, &c->ctx[k]), st, err);
    REFIT_INFO("ipc+nccl transport: %s for %d pairs%s", c->ops[k]->name, sub.npairs,
               c->ctx[k] == NULL ? " (not opened)" : "");
  }
  REFIT_INFO("ipc+nccl transport: %d nodes (%s)", nnodes,
             args->locality == REFIT_LOCALITY_GPU ? "one per GPU" : "hosts");
  free(mine);
  refit_device_locality_free(&loc);
  *out = c;
  return REFIT_OK;

err:
  free(mine);
  refit_device_locality_free(&loc);
  refit_pairs_destroy(c);
  return st;
}

static void refit_pairs_exchange_free(refit_exchange_t *ex) { free(ex); }

/* Complete what is left of `ex` at once, ignoring the outcome: after a
 * failure `st` of one part, whose message stays the one reported. Returns
 * st. */
static refit_status_t refit_pairs_drop(refit_pairs_ctx_t *c, refit_exchange_t *ex,
                                       refit_status_t st) {
  char why[1024];
  snprintf(why, sizeof(why), "%s", refit_last_error());
  for (int k = 0; k < c->n; k++)
    if (ex->sub[k] != NULL)
      c->ops[k]->abandon(c->ctx[k], ex->sub[k]);
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
  for (int i = 0; i < n; i++) {
    const int peer = i < nsends ? sends[i].peer : recvs[i - nsends].peer;
    if (c->via[peer] < 0) {
      free(ex);
      free(x);
      return REFIT_ERR(REFIT_ERR_INTERNAL,
                       "ipc+nccl transport: no transport serves ranks %d and %d", c->rank,
                       peer);
    }
  }
  /* x, per transport in table order: its sends, then its receives. */
  int used = 0;
  for (int k = 0; k < c->n && st == REFIT_OK; k++) {
    refit_xfer_t *s = x + used;
    int ns = 0, nr = 0;
    for (int i = 0; i < nsends; i++)
      if (c->via[sends[i].peer] == k)
        s[ns++] = sends[i];
    refit_xfer_t *r = s + ns;
    for (int i = 0; i < nrecvs; i++)
      if (c->via[recvs[i].peer] == k)
        r[nr++] = recvs[i];
    used += ns + nr;
    if (ns + nr == 0)
      continue;
    if (c->ctx[k] == NULL)
      st = REFIT_ERR(REFIT_ERR_INTERNAL,
                     "ipc+nccl transport: rank %d exchanges with %d ranks over %s, "
                     "but its pair list had none",
                     c->rank, ns + nr, c->ops[k]->name);
    else
      st = c->ops[k]->start(c->ctx[k], s, ns, r, nr, tag, &ex->sub[k]);
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
  for (int k = 0; k < c->n && st == REFIT_OK; k++)
    if (ex->sub[k] != NULL) {
      st = c->ops[k]->wait(c->ctx[k], ex->sub[k], deadline, phase);
      ex->sub[k] = NULL;
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
  int pending = 0;
  *done = 0;
  for (int k = 0; k < c->n && st == REFIT_OK; k++) {
    if (ex->sub[k] == NULL)
      continue;
    int d = 1;
    st = c->ops[k]->test(c->ctx[k], ex->sub[k], &d);
    if (st != REFIT_OK || d)
      ex->sub[k] = NULL; /* freed by test */
    else
      pending++;
  }
  if (st != REFIT_OK) {
    return refit_pairs_drop(c, ex, st);
  }
  if (pending == 0) {
    refit_pairs_exchange_free(ex);
    *done = 1;
  }
  return REFIT_OK;
}

static refit_status_t refit_pairs_register(void *ctx, void *ptr, size_t bytes) {
  refit_pairs_ctx_t *c = ctx;
  for (int k = 0; k < c->n; k++)
    if (c->ctx[k] != NULL && c->ops[k]->register_buffer != NULL)
      REFIT_CHECK(c->ops[k]->register_buffer(c->ctx[k], ptr, bytes));
  return REFIT_OK;
}

static int refit_pairs_healthy(void *ctx) {
  refit_pairs_ctx_t *c = ctx;
  for (int k = 0; k < c->n; k++)
    if (c->ctx[k] != NULL && c->ops[k]->healthy != NULL && !c->ops[k]->healthy(c->ctx[k]))
      return 0;
  return 1;
}

/* Every part repairs, in table order on every rank (each is collective over
 * the world). */
static refit_status_t refit_pairs_recover(void *ctx, double deadline) {
  refit_pairs_ctx_t *c = ctx;
  for (int k = 0; k < c->n; k++)
    if (c->ctx[k] != NULL && c->ops[k]->recover != NULL)
      REFIT_CHECK(c->ops[k]->recover(c->ctx[k], deadline));
  return REFIT_OK;
}

/* In reverse table order. */
static void refit_pairs_destroy(void *ctx) {
  refit_pairs_ctx_t *c = ctx;
  if (c == NULL)
    return;
  for (int k = c->n - 1; k >= 0; k--)
    if (c->ctx[k] != NULL)
      c->ops[k]->destroy(c->ctx[k]);
  free(c->via);
  free(c);
}

/* Each part abandoned on its own transport. */
static void refit_pairs_abandon(void *ctx, refit_exchange_t *ex) {
  (void)refit_pairs_drop(ctx, ex, REFIT_ERR_PEER);
}

const refit_transport_ops_t refit_transport_pairs = {
    .name = "ipc+nccl",
    .kind = REFIT_TRANSPORT_AUTO, /* chosen by auto only */
    .memory = REFIT_MEMORY_DEVICE,
    .registers_buffers = 1,
    .query = refit_pairs_query,
    .create = refit_pairs_create,
    .can_connect = refit_transport_never_per_pair, /* it is the per-pair choice */
    .create_pairs = refit_transport_not_per_pair,
    .start = refit_pairs_start,
    .wait = refit_pairs_wait,
    .test = refit_pairs_test,
    .abandon = refit_pairs_abandon,
    .destroy = refit_pairs_destroy,
    .register_buffer = refit_pairs_register,
    .healthy = refit_pairs_healthy,
    .recover = refit_pairs_recover,
};

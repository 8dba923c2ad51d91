#include "transport/transport.h"

#include "core/log.h"

#include <stdio.h>

/* Compiled-in transports in order of preference for refit.transport: auto,
 * and for the per-pair choice (refit_transport_for_pair). For device memory
 * the GPU transports come first, and auto chooses per pair of ranks by
 * locality: on several nodes the per-pair transport, which gives each pair
 * the first transport below whose can_connect() accepts it (CUDA IPC between
 * ranks of one node, NCCL between nodes; refit.locality: gpu makes each GPU a
 * node); on one node IPC (copy-engine copies, also between ranks of one GPU).
 * Named, NCCL serves every pair when no two ranks share a GPU, and UCX where
 * its build has CUDA. Each query() says whether it holds; auto's error lists
 * every reason. Host memory skips them and reaches MPI. */
static const refit_transport_ops_t *const refit_transports[] = {
#ifdef REFIT_HAVE_CUDA
    &refit_transport_pairs, /* auto only */
    &refit_transport_ipc,
    &refit_transport_nccl,
#endif
    &refit_transport_mpi,
    &refit_transport_ucx, /* host memory: only when named (MPI comes first);
                             device memory: after the per-pair choice, IPC
                             and NCCL */
};

#define REFIT_NTRANSPORTS (sizeof(refit_transports) / sizeof(refit_transports[0]))
_Static_assert(REFIT_NTRANSPORTS <= REFIT_TRANSPORTS_MAX,
               "REFIT_TRANSPORTS_MAX must hold refit_transports[]");

const refit_transport_ops_t *refit_transport_for_pair(const refit_pair_facts_t *pair) {
  for (size_t i = 0; i < REFIT_NTRANSPORTS; i++)
    if (refit_transports[i]->can_connect(pair))
      return refit_transports[i];
  return NULL;
}

int refit_transport_pair_candidates(refit_memory_t memory,
                                    const refit_transport_ops_t **out) {
  /* Every locality two ranks can have: (same node, same GPU). */
  static const int where[][2] = {{1, 1}, {1, 0}, {0, 0}};
  int n = 0;
  for (size_t i = 0; i < REFIT_NTRANSPORTS; i++)
    for (size_t k = 0; k < sizeof(where) / sizeof(where[0]); k++) {
      const refit_pair_facts_t f = {where[k][0], where[k][1], memory};
      if (refit_transport_for_pair(&f) == refit_transports[i]) {
        out[n++] = refit_transports[i];
        break;
      }
    }
  return n;
}

static const char *refit_memory_name(refit_memory_t m) {
  return m == REFIT_MEMORY_DEVICE ? "device" : "host";
}

refit_status_t refit_transport_open(refit_transport_kind_t kind,
                                    const refit_transport_args_t *args,
                                    refit_transport_t *out) {
  const size_t n = REFIT_NTRANSPORTS;
  char why[1024] = ""; /* auto: why each candidate was passed over */
  size_t used = 0;
  for (size_t i = 0; i < n; i++) {
    const refit_transport_ops_t *ops = refit_transports[i];
    if (kind != REFIT_TRANSPORT_AUTO && kind != ops->kind)
      continue;
    if (ops->memory != REFIT_MEMORY_ANY && ops->memory != args->memory) {
      if (kind != REFIT_TRANSPORT_AUTO)
        return REFIT_ERR(REFIT_ERR_CONFIG,
                         "refit.transport %s moves %s memory, but the buffers "
                         "are in %s memory",
                         ops->name, refit_memory_name(ops->memory),
                         refit_memory_name(args->memory));
      REFIT_INFO("transport %s skipped: it moves %s memory, not %s", ops->name,
                 refit_memory_name(ops->memory),
                 refit_memory_name(args->memory));
      continue;
    }
    refit_status_t st = ops->query(args);
    if (st != REFIT_OK) {
      if (kind != REFIT_TRANSPORT_AUTO)
        return st;
      REFIT_INFO("transport %s skipped: %s", ops->name, refit_last_error());
      if (used < sizeof(why))
        used += (size_t)snprintf(why + used, sizeof(why) - used, "; %s",
                                 refit_last_error());
      continue;
    }
    REFIT_CHECK(refit_transport_check_table(ops));
    REFIT_CHECK(ops->create(args, &out->ctx));
    out->ops = ops;
    REFIT_INFO("transport %s selected", ops->name);
    if (!args->lengths_ahead && (!args->variable_length || ops->variable_length))
      return REFIT_OK;
    /* Every rank chose the same transport (query is collective), so every
     * rank wraps it. */
    st = refit_transport_lengths_wrap(out, args);
    if (st != REFIT_OK)
      refit_transport_close(out);
    else
      REFIT_INFO("transport %s: message lengths go ahead of each exchange over mpi",
                 out->ops->name);
    return st;
  }
  if (kind != REFIT_TRANSPORT_AUTO)
    return REFIT_ERR(REFIT_ERR_NOT_AVAILABLE,
                     "refit.transport %d is not compiled into this build "
                     "(GPU transports need REFIT_CUDA=ON)",
                     (int)kind);
  return REFIT_ERR(REFIT_ERR_NOT_AVAILABLE,
                   "no compiled-in transport can move %s memory for this job%s",
                   refit_memory_name(args->memory), why);
}

refit_status_t refit_transport_register(refit_transport_t *t, void *ptr,
                                        size_t bytes) {
  if (t->ops == NULL)
    return REFIT_ERR(REFIT_ERR_STATE, "register_buffer: transport not open");
  return t->ops->register_buffer(t->ctx, ptr, bytes);
}

refit_status_t refit_transport_check_table(const refit_transport_ops_t *ops) {
  const struct {
    const char *name;
    int set;
  } fns[] = {
      {"query", ops->query != NULL},
      {"create", ops->create != NULL},
      {"can_connect", ops->can_connect != NULL},
      {"create_pairs", ops->create_pairs != NULL},
      {"start", ops->start != NULL},
      {"wait", ops->wait != NULL},
      {"test", ops->test != NULL},
      {"abandon", ops->abandon != NULL},
      {"destroy", ops->destroy != NULL},
      {"register_buffer", ops->register_buffer != NULL},
      {"healthy", ops->healthy != NULL},
      {"recover", ops->recover != NULL},
  };
  char missing[256] = "";
  size_t used = 0;
  for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++)
    if (!fns[i].set && used < sizeof(missing))
      used += (size_t)snprintf(missing + used, sizeof(missing) - used, "%s%s",
                               used ? ", " : "", fns[i].name);
  if (used == 0)
    return REFIT_OK;
  return REFIT_ERR(REFIT_ERR_STATE,
                   "transport %s: its table leaves %s unset (every function is "
                   "required; transport.h lists the explicit defaults)",
                   ops->name != NULL ? ops->name : "(unnamed)", missing);
}

refit_status_t refit_transport_register_none(void *ctx, void *ptr, size_t bytes) {
  (void)ctx;
  (void)ptr;
  (void)bytes;
  return REFIT_OK;
}

int refit_transport_never_per_pair(const refit_pair_facts_t *pair) {
  (void)pair;
  return 0;
}

refit_status_t refit_transport_not_per_pair(const refit_transport_args_t *args,
                                            const refit_pair_locality_t *loc, void **ctx) {
  (void)args;
  (void)loc;
  (void)ctx;
  return REFIT_ERR(REFIT_ERR_STATE,
                   "this transport is never chosen per pair of ranks (can_connect "
                   "answers 0), so the per-pair transport cannot open it");
}

void refit_transport_close(refit_transport_t *t) {
  if (t->ops != NULL)
    t->ops->destroy(t->ctx);
  t->ops = NULL;
  t->ctx = NULL;
}

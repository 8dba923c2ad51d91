#include "transport.h"

#include "core/log.h"

/* Compiled-in transports in order of preference for refit.transport: auto. */
static const refit_transport_ops_t *const refit_transports[] = {
    &refit_transport_mpi,
};

refit_status_t refit_transport_open(refit_transport_kind_t kind,
                                    const refit_transport_args_t *args,
                                    refit_transport_t *out) {
  const size_t n = sizeof(refit_transports) / sizeof(refit_transports[0]);
  for (size_t i = 0; i < n; i++) {
    const refit_transport_ops_t *ops = refit_transports[i];
    if (kind != REFIT_TRANSPORT_AUTO && kind != ops->kind)
      continue;
    refit_status_t st = ops->query(args);
    if (st != REFIT_OK) {
      if (kind != REFIT_TRANSPORT_AUTO)
        return st;
      REFIT_INFO("transport %s skipped: %s", ops->name, refit_last_error());
      continue;
    }
    REFIT_CHECK(ops->create(args, &out->ctx));
    out->ops = ops;
    REFIT_INFO("transport %s selected", ops->name);
    return REFIT_OK;
  }
  return REFIT_ERR(REFIT_ERR_NOT_AVAILABLE,
                   "no compiled-in transport can serve refit.transport %d",
                   (int)kind);
}

void refit_transport_close(refit_transport_t *t) {
  if (t->ops != NULL)
    t->ops->destroy(t->ctx);
  t->ops = NULL;
  t->ctx = NULL;
}

/*
 * Transports move one bucket's messages between trainer and generator ranks.
 *
 * A transport is a table of functions (refit_transport_ops_t). The runtime
 * asks each compiled-in transport, in the order of refit_transports[], whether
 * it can serve the job; with refit.transport: auto the first that can wins,
 * naming one forces it (and an impossible choice is an error).
 *
 * One exchange = the sends and receives of one rank for one bucket; it is
 * started without blocking and completed by wait(), which returns
 * REFIT_ERR_TIMEOUT naming the peers still outstanding when the deadline
 * passes, never hangs. At most REFIT_EXCHANGES_IN_FLIGHT exchanges per rank
 * are open at once (double buffering).
 */
#ifndef REFIT_TRANSPORT_H
#define REFIT_TRANSPORT_H

#include "config.h"

#include <mpi.h>
#include <stddef.h>

#define REFIT_EXCHANGES_IN_FLIGHT 2

typedef struct {
  int peer;    /* rank in the world communicator */
  void *buf;   /* host memory for the MPI transport */
  size_t bytes;
} refit_xfer_t;

typedef struct {
  MPI_Comm world;
  int world_rank, world_size;
  double timeout_s;
} refit_transport_args_t;

typedef struct refit_exchange refit_exchange_t;

typedef struct {
  const char *name;
  refit_transport_kind_t kind;
  /* REFIT_OK when this transport can serve the job; otherwise the reason. */
  refit_status_t (*query)(const refit_transport_args_t *args);
  refit_status_t (*create)(const refit_transport_args_t *args, void **ctx);
  /* Post every send and receive of one bucket; `tag` tells buckets apart. */
  refit_status_t (*start)(void *ctx, const refit_xfer_t *sends, int nsends,
                          const refit_xfer_t *recvs, int nrecvs, int tag,
                          refit_exchange_t **ex);
  /* Complete an exchange by `deadline` (MPI_Wtime seconds); frees it. */
  refit_status_t (*wait)(void *ctx, refit_exchange_t *ex, double deadline,
                         const char *phase);
  void (*destroy)(void *ctx);
} refit_transport_ops_t;

typedef struct {
  const refit_transport_ops_t *ops;
  void *ctx;
} refit_transport_t;

/* Pick and create the transport for `kind` (REFIT_TRANSPORT_AUTO: first that
 * can serve). */
refit_status_t refit_transport_open(refit_transport_kind_t kind,
                                    const refit_transport_args_t *args,
                                    refit_transport_t *out);
void refit_transport_close(refit_transport_t *t);

extern const refit_transport_ops_t refit_transport_mpi;

#endif /* REFIT_TRANSPORT_H */

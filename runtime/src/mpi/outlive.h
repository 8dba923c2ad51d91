/*
 * Buffers that outlive a deadline: the one rule for every non-blocking MPI
 * operation refit gives up on.
 *
 * A request that missed its deadline (a peer dead, stalled or merely late)
 * can be neither completed nor safely freed: the peer may still arrive, and
 * MPI then writes the operation's receive buffers or reads its send
 * buffers. So such an operation never uses a stack frame or memory its
 * owner frees: its buffers are heap blocks, handed here with the request on
 * a missed deadline. They stay allocated until MPI completes the request
 * (tested each time this module is called again), or else until the process
 * exits. Memory that a request already released (MPI_Request_free, no
 * handle left to test) may still target is kept until the process exits.
 * Everything held hangs off one static list, so a leak checker sees it
 * held, not lost.
 */
#ifndef REFIT_OUTLIVE_H
#define REFIT_OUTLIVE_H

#include "refit/status.h"

#include <mpi.h>

/* Complete *req by `deadline` (MPI_Wtime seconds; refit_mpi_request_wait).
 * blocks[0..n) are the heap blocks (malloc) the operation reads or writes;
 * NULL entries are ignored. REFIT_OK: the caller still owns the blocks. Any
 * failure (REFIT_ERR_TIMEOUT, REFIT_ERR_MPI): the request and the blocks
 * belong to this module (refit_outlive_park); the caller must neither touch
 * nor free them. */
refit_status_t refit_outlive_wait(MPI_Request *req, double deadline, const char *what,
                                  void *const *blocks, int n);

/* Hand over a request that missed its deadline with the heap blocks
 * (malloc) it reads or writes: freed (free) once it completes (at once if
 * *req is MPI_REQUEST_NULL), or kept until the process exits. *req becomes
 * MPI_REQUEST_NULL. */
void refit_outlive_park(MPI_Request *req, void *const *blocks, int n);

/* refit_outlive_park of several requests reqs[0..nreq) that share the
 * blocks: freed once every one of them completed. Each reqs[i] becomes
 * MPI_REQUEST_NULL. */
void refit_outlive_park_all(MPI_Request *reqs, int nreq, void *const *blocks, int n);

/* Keep memory of any kind (host, device, whole objects) that released
 * requests, or a peer's transport, may still touch, with no request left
 * to test: never freed; the process exit reclaims it. */
void refit_outlive_keep(void *const *blocks, int n);

#endif /* REFIT_OUTLIVE_H */

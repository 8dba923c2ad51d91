/*
 * Waiting on MPI with a deadline: the one way refit completes a non-blocking
 * MPI call whose peer may never come (a dead, stalled or late rank). Below the
 * transports and the device layer, which both start collectives this way;
 * outlive.h keeps the buffers of a wait that gave up.
 */
#ifndef REFIT_MPI_WAIT_H
#define REFIT_MPI_WAIT_H

#include "refit/status.h"

#include <mpi.h>

/* Between polls of work that completes on its own (`*spins`: 0 when the
 * wait starts, or again when it made progress): spin for latency for the
 * first REFIT_POLL_SPINS calls, then nap 20 us, twice as long after every
 * REFIT_POLL_SPINS naps, at most 1 ms. A nap (by how much a wait can
 * overrun the completion it waits for) stays within a few percent of the
 * time already waited, under 2 % past the first 4 ms; a rank that waits
 * long (for a slow peer, or out a deadline) leaves the cores to the ranks
 * that work. At 20 us per nap throughout, such a rank took about a third of
 * a core polling: 12 of the 14 s of CPU of a stall-and-recover test
 * (lifecycle_cycles_mpi, 3 ranks waiting out 2 s deadlines). */
#define REFIT_POLL_SPINS 64
void refit_poll_nap(unsigned *spins);

/* Complete an MPI request by `deadline` (MPI_Wtime seconds), napping between
 * tests: REFIT_OK; REFIT_ERR_TIMEOUT, the request still pending (a peer never
 * joined: it can be neither completed nor freed safely); or REFIT_ERR_MPI.
 * `what` names the wait in messages. */
refit_status_t refit_mpi_request_wait(MPI_Request *req, double deadline,
                                      const char *what);

/* A transport's start-up collective: `rc` is the non-blocking MPI call that
 * started *req, completed by `deadline` (refit_mpi_request_wait). On
 * REFIT_ERR_TIMEOUT its buffers still belong to MPI: the caller must keep
 * them (leak them) rather than free them. */
refit_status_t refit_mpi_startup(int rc, MPI_Request *req, double deadline,
                                 const char *what);

#endif /* REFIT_MPI_WAIT_H */

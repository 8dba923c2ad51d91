#include "mpi/wait.h"

#include "core/error.h"

#include <limits.h>
#include <time.h>

void refit_poll_nap(unsigned *spins) {
  if (*spins < UINT_MAX)
    ++*spins;
  if (*spins <= REFIT_POLL_SPINS)
    return;
  /* Nap k (from 0) lasts 20 us << (k / 64), at most 1 ms. */
  const unsigned doublings = (*spins - REFIT_POLL_SPINS - 1) / REFIT_POLL_SPINS;
  long ns = 20000L << (doublings < 6 ? doublings : 6);
  if (ns > 1000000L)
    ns = 1000000L;
  struct timespec ts = {0, ns};
  nanosleep(&ts, NULL);
}

refit_status_t refit_mpi_startup(int rc, MPI_Request *req, double deadline,
                                 const char *what) {
  if (rc != MPI_SUCCESS)
    return REFIT_ERR(REFIT_ERR_MPI, "%s: MPI call failed (%d)", what, rc);
  return refit_mpi_request_wait(req, deadline, what);
}

refit_status_t refit_mpi_request_wait(MPI_Request *req, double deadline,
                                      const char *what) {
  unsigned spins = 0;
  for (;;) {
    int done = 0;
    if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return REFIT_ERR(REFIT_ERR_MPI, "%s: MPI_Test failed", what);
    if (done)
      return REFIT_OK;
    if (MPI_Wtime() > deadline)
      return REFIT_ERR(REFIT_ERR_TIMEOUT,
                       "%s: not every rank joined by the deadline", what);
    refit_poll_nap(&spins);
  }
}

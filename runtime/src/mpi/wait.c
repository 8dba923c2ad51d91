#include "mpi/wait.h"

#include "core/error.h"

#include <time.h>

void refit_poll_nap(unsigned *spins) {
  if (++*spins > 64) {
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
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

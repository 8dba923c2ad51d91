/*
 * Buffers that outlive a deadline (outlive.h): a process-wide list of
 * requests refit gave up on, each with the heap blocks it owns, and of
 * memory kept until exit. Sessions of different threads share it, so it is
 * guarded by a mutex.
 */
#include "mpi/outlive.h"

#include "mpi/wait.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct refit_outlived {
  struct refit_outlived *next;
  MPI_Request *reqs; /* freed when every one completed */
  int nreq;
  int forever; /* no request: kept until the process exits */
  int n;
  void *blocks[];
} refit_outlived_t;

static pthread_mutex_t refit_outlive_lock = PTHREAD_MUTEX_INITIALIZER;
static refit_outlived_t *refit_outlive_list; /* a root: nothing held is lost */

/* Free what completed (caller holds the lock). MPI_Test only while MPI is
 * up: before MPI_Init nothing was parked, after MPI_Finalize nothing can
 * complete. */
static void refit_outlive_sweep(void) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin)
    return;
  for (refit_outlived_t **at = &refit_outlive_list; *at != NULL;) {
    refit_outlived_t *e = *at;
    int done = 0;
    if (!e->forever &&
        (e->nreq == 0 ||
         (MPI_Testall(e->nreq, e->reqs, &done, MPI_STATUSES_IGNORE) == MPI_SUCCESS &&
          done))) {
      *at = e->next;
      for (int i = 0; i < e->n; i++)
        free(e->blocks[i]);
      free(e->reqs);
      free(e);
      continue;
    }
    at = &e->next;
  }
}

/* Requests already completed (MPI_REQUEST_NULL) are not kept. */
static void refit_outlive_add(MPI_Request *reqs, int nreq, int forever,
                              void *const *blocks, int n) {
  refit_outlived_t *e = calloc(1, sizeof(*e) + (size_t)(n > 0 ? n : 0) * sizeof(void *));
  MPI_Request *kept = nreq > 0 ? malloc((size_t)nreq * sizeof(*kept)) : NULL;
  if (e != NULL && nreq > 0 && kept == NULL) {
    free(e);
    e = NULL;
  }
  pthread_mutex_lock(&refit_outlive_lock);
  refit_outlive_sweep();
  if (e != NULL) { /* out of memory: the blocks and requests stay, unnamed */
    e->reqs = kept;
    for (int i = 0; i < nreq; i++)
      if (reqs[i] != MPI_REQUEST_NULL)
        kept[e->nreq++] = reqs[i];
    e->forever = forever;
    for (int i = 0; i < n; i++)
      if (blocks[i] != NULL)
        e->blocks[e->n++] = blocks[i];
    e->next = refit_outlive_list;
    refit_outlive_list = e;
  }
  pthread_mutex_unlock(&refit_outlive_lock);
}

void refit_outlive_park_all(MPI_Request *reqs, int nreq, void *const *blocks, int n) {
  refit_outlive_add(reqs, nreq, 0, blocks, n);
  for (int i = 0; i < nreq; i++)
    reqs[i] = MPI_REQUEST_NULL;
}

void refit_outlive_park(MPI_Request *req, void *const *blocks, int n) {
  refit_outlive_park_all(req, 1, blocks, n);
}

void refit_outlive_keep(void *const *blocks, int n) {
  refit_outlive_add(NULL, 0, 1, blocks, n);
}

refit_status_t refit_outlive_wait(MPI_Request *req, double deadline, const char *what,
                                  void *const *blocks, int n) {
  refit_status_t st = refit_mpi_request_wait(req, deadline, what);
  if (st != REFIT_OK)
    refit_outlive_park(req, blocks, n);
  return st;
}

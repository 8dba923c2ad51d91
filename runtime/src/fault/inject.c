/*
 * The fault seam in action (test builds only): whether a fault fires here,
 * and the actions that are the same in every phase. The data faults (a
 * flipped bit, a truncated, dropped or stale message) are applied where the
 * data is, by the session, when refit_fault_fires() says so.
 */
#include "fault/fault.h"

#include "core/error.h"
#include "core/hash.h"
#include "core/log.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

int refit_fault_fires(const refit_fault_t *f, int phase, int rank, uint64_t attempt,
                      uint64_t seed) {
  if (!f->enabled || f->phase != phase || f->rank != rank)
    return 0;
  if (phase == REFIT_FAULT_PHASE_OPEN) /* before any refit: refit, p do not apply */
    return 1;
  if (f->refit != 0 && (uint64_t)f->refit != attempt)
    return 0;
  if (f->probability < 1.0) {
    const uint64_t h = refit_hash_u64(refit_hash_u64(REFIT_HASH_INIT, seed), attempt);
    if ((double)(h >> 11) / (double)(UINT64_C(1) << 53) >= f->probability)
      return 0;
  }
  return 1;
}

static void refit_fault_sleep(double seconds) {
  struct timespec ts = {(time_t)seconds,
                        (long)((seconds - (double)(time_t)seconds) * 1e9)};
  nanosleep(&ts, NULL);
}

refit_status_t refit_fault_act(const refit_fault_t *f, int rank, double timeout_s,
                               const char *where) {
  switch (f->action) {
  case REFIT_FAULT_KILL:
    REFIT_WARN("fault seam: killing rank %d at %s", rank, where);
    raise(SIGKILL);
    break;
  case REFIT_FAULT_EXIT:
    REFIT_WARN("fault seam: rank %d exits at %s", rank, where);
    _exit(7);
  case REFIT_FAULT_STALL:
    REFIT_WARN("fault seam: rank %d stalls at %s", rank, where);
    /* Half of timeout_s: long enough to be seen, and inside every peer's
     * deadline whenever that peer started waiting (a trainer that sent
     * everything early waits at the vote from then on, only timeout_s), so
     * the outcome does not depend on the build's speed: this rank fails its
     * refit with a timeout of its own, votes no, and every rank aborts. */
    refit_fault_sleep(0.5 * timeout_s);
    return REFIT_ERR(REFIT_ERR_TIMEOUT, "fault seam: rank %d stalled at %s", rank, where);
  case REFIT_FAULT_ERROR:
    return REFIT_ERR(REFIT_ERR_INTERNAL, "fault seam: injected error at %s on rank %d",
                     where, rank);
  default:
    break;
  }
  return REFIT_OK;
}

void refit_fault_hold(int rank, const char *where, double seconds) {
  REFIT_WARN("fault seam: rank %d stalls %s", rank, where);
  refit_fault_sleep(seconds);
}

int32_t refit_fault_bucket(const refit_fault_t *f, int32_t nbuckets) {
  int32_t b = (int32_t)(f->at * nbuckets);
  if (b >= nbuckets)
    b = nbuckets - 1;
  return b < 0 ? 0 : b;
}

/*
 * The bucket timeline of one refit on one rank (refit.timeline): when each
 * bucket's pack, exchange and land started and ended, on CLOCK_MONOTONIC,
 * in seconds after the refit's begin. It is what the planner's prediction
 * (refit-plan --copy-gbps) is checked against, bucket by bucket
 * (launch/check_prediction.py, docs/benchmarks.md).
 *
 * Off (the session holds no timeline) unless refit.timeline names a file
 * prefix: then every mark is one clock read and a store, and after each
 * committed refit the rank writes PREFIX.refit<A>.rank<R>.json (A the
 * session's attempt, R the world rank):
 *
 *   {"format": "refit-timeline-1", "rank": R, "side": "trainer"|"generator",
 *    "role_rank": r, "version": V, "attempt": A, "transport": "mpi",
 *    "buckets": N, "clock": "CLOCK_MONOTONIC", "t0": T,
 *    "phases": {"begin": [s, e], "source": [s, e] | null,
 *               "progress_end": t, "commit": [s, e]},
 *    "bucket": [{"b": 0, "bytes": n, "post": t, "pack": [s, e] | null,
 *                "wait": [s, e], "land": [s, e] | null,
 *                "cpu": {"pack": c | null, "wait": c, "land": c | null}}, ...]}
 *
 * t0 is the begin on the absolute monotonic clock (ranks of one host share
 * it, so their files line up); every other time is relative to it. Per
 * bucket: `bytes` this rank's messages (sent or received); `pack` the
 * trainer's pack pass (kernel included); `post` when the exchange was
 * started (a trainer's send after its pack, a generator's receive, posted
 * one bucket ahead); `wait` from the first time the rank waited on the
 * exchange to when it saw it complete (a trainer waits for bucket b before
 * packing b + 2, the slot's reuse); `land` the generator's land pass (copy
 * or quantize, layout, digests, the save of restore: full). `cpu` holds
 * the process's CPU seconds (CLOCK_PROCESS_CPUTIME_ID) in each of those
 * spans: below the span's length where the rank was off its core (more
 * ranks than cores), above it where helper threads ran. A field that does
 * not apply to the rank's side is null.
 */
#ifndef REFIT_TIMELINE_H
#define REFIT_TIMELINE_H

#include "core/error.h"
#include "transport/transport.h"

#include <math.h>
#include <stdint.h>
#include <time.h>

/* The marks of one bucket, in the order of its fields in the file. */
typedef enum {
  REFIT_TL_PACK_START = 0,
  REFIT_TL_PACK_END,
  REFIT_TL_POST,
  REFIT_TL_WAIT_START,
  REFIT_TL_WAIT_END,
  REFIT_TL_LAND_START,
  REFIT_TL_LAND_END,
  REFIT_TL_FIELDS
} refit_tl_field_t;

/* The marks of the refit as a whole. */
typedef enum {
  REFIT_TL_BEGIN_END = 0, /* the begin returned (headers, source, amax) */
  REFIT_TL_SOURCE_START,  /* trainer: the source produces its weights */
  REFIT_TL_SOURCE_END,
  REFIT_TL_PROGRESS_END, /* the last progress call that finished the refit */
  REFIT_TL_COMMIT_START,
  REFIT_TL_COMMIT_END,
  REFIT_TL_PHASES
} refit_tl_phase_t;

typedef struct {
  int32_t nbuckets;
  double t0;                     /* begin, absolute monotonic seconds */
  double *stamp;                 /* [nbuckets][REFIT_TL_FIELDS], NaN: unset */
  double *cpu;                   /* the process's CPU seconds at each mark */
  int64_t *bytes;                /* [nbuckets] */
  double phase[REFIT_TL_PHASES]; /* NaN: unset */
  int32_t slot_bucket[REFIT_EXCHANGES_IN_FLIGHT]; /* each slot's bucket */
} refit_timeline_t;

static inline double refit_timeline_read(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double refit_timeline_clock(void) {
  return refit_timeline_read(CLOCK_MONOTONIC);
}

/* The marks of refits of `nbuckets` buckets, or NULL without memory (the
 * caller reports it). */
refit_timeline_t *refit_timeline_create(int32_t nbuckets);
void refit_timeline_destroy(refit_timeline_t *tl);

/* A new refit begun at `t0` (refit_timeline_clock): every mark unset. */
void refit_timeline_start(refit_timeline_t *tl, double t0);

/* Mark `field` of bucket b now; `first`: only where still unset (a wait
 * that polls several times keeps its first). No-op on a NULL timeline or
 * a bucket out of range. */
static inline void refit_timeline_mark(refit_timeline_t *tl, int32_t b,
                                       refit_tl_field_t field, int first) {
  if (tl == NULL || b < 0 || b >= tl->nbuckets)
    return;
  const int64_t i = (int64_t)b * REFIT_TL_FIELDS + field;
  if (!first || isnan(tl->stamp[i])) {
    tl->stamp[i] = refit_timeline_clock() - tl->t0;
    tl->cpu[i] = refit_timeline_read(CLOCK_PROCESS_CPUTIME_ID);
  }
}

static inline void refit_timeline_phase(refit_timeline_t *tl, refit_tl_phase_t phase) {
  if (tl != NULL)
    tl->phase[phase] = refit_timeline_clock() - tl->t0;
}

/* Bucket b went out in exchange slot `slot` with `bytes` of messages: its
 * post mark, and the slot's bucket for the wait that completes it. */
static inline void refit_timeline_post(refit_timeline_t *tl, int32_t b, int slot,
                                       int64_t bytes) {
  if (tl == NULL || b < 0 || b >= tl->nbuckets)
    return;
  refit_timeline_mark(tl, b, REFIT_TL_POST, 0);
  tl->bytes[b] = bytes;
  tl->slot_bucket[slot] = b;
}

/* The bucket in flight in `slot` (-1 on a NULL timeline). */
static inline int32_t refit_timeline_slot(const refit_timeline_t *tl, int slot) {
  return tl == NULL ? -1 : tl->slot_bucket[slot];
}

/* Who wrote the timeline, for the file's header. */
typedef struct {
  int rank, role_rank, trainer;
  uint64_t version;
  uint32_t attempt;
  const char *transport;
} refit_timeline_owner_t;

/* Write PREFIX.refit<attempt>.rank<rank>.json. Errors: REFIT_ERR_SYSTEM
 * (the file cannot be written: its path and errno's text). */
refit_status_t refit_timeline_write(const refit_timeline_t *tl, const char *prefix,
                                    const refit_timeline_owner_t *who);

#endif /* REFIT_TIMELINE_H */

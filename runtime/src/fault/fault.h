/*
 * The fault seam (tests): where and how a refit is made to fail on purpose.
 * It comes from the config's refit.fault section, or from the environment
 * variable REFIT_FAULT (switched on by REFIT_ENABLE_FAULTS=1 or a
 * refit.fault section). REFIT_FAULT's values go through the bounds of
 * refit.fault's rows of the config table (config_table.h), so both
 * spellings accept the same values and refuse the same ones.
 *
 * Compiled into test builds only (CMake option REFIT_TESTS, which defines
 * REFIT_HAVE_FAULTS): fault.c parses, inject.c fires and acts. A production
 * build compiles neither: below, refit_fault_fires() is the constant 0, so
 * every place the protocol code asks is dead code, and off.c only warns
 * that a REFIT_FAULT it was given is ignored (the config refuses
 * refit.fault: config_rules.c).
 */
#ifndef REFIT_FAULT_H
#define REFIT_FAULT_H

/* REFIT_FAULTS_BUILT (config.h): is the seam compiled in? */
#include "config/config.h"
#include "refit/status.h"

#include <stdint.h>

/* The seam as a session holds it; the fields are refit.fault's. */
typedef struct refit_fault {
  int enabled;        /* a fault is armed */
  int phase;          /* refit_fault_phase_t */
  int rank;           /* world rank that injects the fault */
  int action;         /* refit_fault_action_t */
  double at;          /* fraction of the phase's bytes, 0..1 */
  int refit;          /* which refit, 1-based; 0 = every refit */
  double probability; /* 0 < p <= 1: chance per refit */
} refit_fault_t;

/* The seam a session runs with: the config's refit.fault, replaced by
 * REFIT_FAULT when the seam is on (refit_fault_select); warns once when
 * REFIT_FAULT is set but ignored. A production build: always off, with that
 * warning. */
refit_status_t refit_fault_from_env(const refit_config_t *cfg, int world_size,
                                    refit_fault_t *out);

#ifdef REFIT_HAVE_FAULTS
/*
 * Parse a REFIT_FAULT value: comma-separated key=value pairs,
 * "phase=transfer,rank=2,action=kill,at=0.5,refit=1,p=1" (p is short for
 * probability). phase, rank and action are required, the others default as
 * in the config; every value is checked against its row's choices or
 * bounds, rank against `world_size` (0: not checked), and the quantize
 * phase against `precision` (refit_precision_t; -1: not checked), as
 * refit_config_parse() checks refit.fault. On success *out is filled with
 * enabled = 1; on failure it is untouched and REFIT_ERR_CONFIG names every
 * problem ("REFIT_FAULT: rank: '-1' is not an integer in [0, ...]").
 */
refit_status_t refit_fault_parse(const char *text, int world_size, int precision,
                                 refit_fault_t *out);

/*
 * The seam a session runs with: the config's refit.fault, replaced by
 * `env_fault` (REFIT_FAULT's value, NULL or "" when unset) only when the
 * seam is on: `env_enable` (REFIT_ENABLE_FAULTS's value) is "1", or the
 * config has a refit.fault section. *ignored (if not NULL) is set to 1 when
 * env_fault was given but the seam is off, so that the caller can say so.
 * Errors: those of refit_fault_parse(), *out untouched.
 */
refit_status_t refit_fault_select(const refit_config_t *cfg, int world_size,
                                  const char *env_fault, const char *env_enable,
                                  refit_fault_t *out, int *ignored);

/* Does fault `f` fire on world rank `rank`, in `phase` (refit_fault_phase_t),
 * in refit `attempt` (1-based)? Under a probability below 1 the draw is a
 * hash of `seed` and `attempt`, the same on every run. The open phase comes
 * before any refit: refit and probability do not apply to it. */
int refit_fault_fires(const refit_fault_t *f, int phase, int rank, uint64_t attempt,
                      uint64_t seed);

/* The actions that are the same in every phase, at `where` (for the log):
 * kill (SIGKILL) and exit (_exit(7)) end the process; stall sleeps half of
 * `timeout_s` (seen by every peer, inside each one's deadline) and returns
 * REFIT_ERR_TIMEOUT; error returns REFIT_ERR_INTERNAL. Every other action
 * returns REFIT_OK: a data fault, which the caller applies. */
refit_status_t refit_fault_act(const refit_fault_t *f, int rank, double timeout_s,
                               const char *where);

/* Stall `seconds` at `where`, with a warning, then go on. */
void refit_fault_hold(int rank, const char *where, double seconds);

/* The bucket, of `nbuckets`, at which a fault at fraction f->at fires. */
int32_t refit_fault_bucket(const refit_fault_t *f, int32_t nbuckets);
#else
/* A production build: the seam never fires, so the compiler drops every
 * branch that asks; what those branches call is never referenced. */
static inline int refit_fault_fires(const refit_fault_t *f, int phase, int rank,
                                    uint64_t attempt, uint64_t seed) {
  (void)f, (void)phase, (void)rank, (void)attempt, (void)seed;
  return 0;
}

static inline refit_status_t refit_fault_act(const refit_fault_t *f, int rank,
                                             double timeout_s, const char *where) {
  (void)f, (void)rank, (void)timeout_s, (void)where;
  return REFIT_OK;
}

static inline void refit_fault_hold(int rank, const char *where, double seconds) {
  (void)rank, (void)where, (void)seconds;
}

static inline int32_t refit_fault_bucket(const refit_fault_t *f, int32_t nbuckets) {
  (void)f, (void)nbuckets;
  return -1;
}
#endif

#endif /* REFIT_FAULT_H */

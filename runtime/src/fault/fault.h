/*
 * The fault seam (tests): where and how a refit is made to fail on purpose.
 * Compiled into test builds only (CMake option REFIT_TESTS).
 * It comes from the config's refit.fault section, or from the environment
 * variable REFIT_FAULT, which a production binary ignores unless the seam
 * is switched on (REFIT_ENABLE_FAULTS=1, or a refit.fault section in the
 * config). REFIT_FAULT's values go through the bounds of refit.fault's rows
 * of the config table (config_table.h), so both spellings accept the same
 * values and refuse the same ones.
 */
#ifndef REFIT_FAULT_H
#define REFIT_FAULT_H

/* REFIT_FAULTS_BUILT (config.h): is the seam compiled in? */
#include "config/config.h"
#include "refit/status.h"

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

/* refit_fault_select() with REFIT_FAULT and REFIT_ENABLE_FAULTS read from
 * the environment; warns once when REFIT_FAULT is set but ignored. */
refit_status_t refit_fault_from_env(const refit_config_t *cfg, int world_size,
                                    refit_fault_t *out);

#endif /* REFIT_FAULT_H */

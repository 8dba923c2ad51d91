/*
 * Environment variables: the one place that lists every variable refit's
 * code, launcher and Python package read, with its kind, its bounds and its
 * precedence (docs/configuration.md's table is checked against this one by
 * tests/runtime/check_config_doc.py). The runtime and the kernels read
 * their variables only through the functions below (not listed: the
 * benchmark tools' REFIT_BENCH_REPS, and other programs' variables refit
 * only looks at, CUDA_VISIBLE_DEVICES in a message and Open MPI's to tell a
 * singleton), which refuse a malformed or out-of-bounds
 * value with a message naming the variable, what it holds and the bounds,
 * instead of ignoring it.
 *
 * Owns: the table and the parsing. May call: core/error only.
 */
#ifndef REFIT_CORE_ENV_H
#define REFIT_CORE_ENV_H

#include "refit/status.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  REFIT_ENV_INT = 0,    /* a decimal integer in [lo, hi] */
  REFIT_ENV_SECONDS = 1, /* a number of seconds in (lo, hi] */
  REFIT_ENV_CHOICE = 2, /* one of `choices` ('|'-separated, any case) */
  REFIT_ENV_TEXT = 3    /* any non-empty text (a path, a spec another parser reads) */
} refit_env_kind_t;

/* Who reads a variable: refit's C code through this file, or only the
 * launcher scripts or the Python package (listed here all the same). */
typedef enum { REFIT_ENV_BY_C = 0, REFIT_ENV_BY_SCRIPTS = 1, REFIT_ENV_BY_PYTHON = 2 } refit_env_reader_t;

/*
 * X(NAME, kind, lo, hi, choices, reader, precedence)
 * `precedence` says what wins over the variable and what it wins over, and
 * its default; docs/configuration.md states the same in words.
 */
#define REFIT_ENV_TABLE(X)                                                                   \
  X("REFIT_DEBUG", REFIT_ENV_CHOICE, 0, 0, "NONE|WARN|INFO|TRACE", REFIT_ENV_BY_C,          \
    "default WARN")                                                                          \
  X("REFIT_STARTUP_TIMEOUT_S", REFIT_ENV_SECONDS, 0, 86400, NULL, REFIT_ENV_BY_C,           \
    "default 300; rank 0's value applies to every rank; refit.timeout_s after the config")  \
  X("REFIT_FAULT", REFIT_ENV_TEXT, 0, 0, NULL, REFIT_ENV_BY_C,                                \
    "replaces refit.fault when the seam is on; test builds only")                           \
  X("REFIT_ENABLE_FAULTS", REFIT_ENV_INT, 0, 1, NULL, REFIT_ENV_BY_C,                        \
    "default 0; 1 switches the seam on for REFIT_FAULT")                                    \
  X("REFIT_LOCAL_RANK", REFIT_ENV_INT, 0, 1 << 20, NULL, REFIT_ENV_BY_C,                     \
    "wins over OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID, host names")     \
  X("OMPI_COMM_WORLD_LOCAL_RANK", REFIT_ENV_INT, 0, 1 << 20, NULL, REFIT_ENV_BY_C,           \
    "after REFIT_LOCAL_RANK")                                                                \
  X("SLURM_LOCALID", REFIT_ENV_INT, 0, 1 << 20, NULL, REFIT_ENV_BY_C,                        \
    "after OMPI_COMM_WORLD_LOCAL_RANK")                                                      \
  X("MPI_LOCALRANKID", REFIT_ENV_INT, 0, 1 << 20, NULL, REFIT_ENV_BY_C,                      \
    "after SLURM_LOCALID; else the rank among those of its host")                           \
  X("REFIT_KERNELS_THREADS", REFIT_ENV_INT, 1, 16, NULL, REFIT_ENV_BY_C,                     \
    "default: the online CPUs, at most 16")                                                  \
  X("REFIT_AGENT_DIR", REFIT_ENV_TEXT, 0, 0, NULL, REFIT_ENV_BY_C,                           \
    "an explicit socket directory wins; default /tmp/refit-agent-<uid>")                     \
  X("REFIT_JOIN_KEY_FILE", REFIT_ENV_TEXT, 0, 0, NULL, REFIT_ENV_BY_C,                       \
    "default: the port file's name plus .key")                                               \
  X("REFIT_LIBRARY", REFIT_ENV_TEXT, 0, 0, NULL, REFIT_ENV_BY_PYTHON,                        \
    "wins over every other place of librefit.so")                                            \
  X("REFIT_BUILD_DIR", REFIT_ENV_TEXT, 0, 0, NULL, REFIT_ENV_BY_SCRIPTS,                     \
    "--build-dir wins; default build/")                                                      \
  X("REFIT_GPUS_PER_NODE", REFIT_ENV_INT, 0, 1 << 10, NULL, REFIT_ENV_BY_SCRIPTS,            \
    "set by refit-launch from --gpus-per-node")                                              \
  X("REFIT_NIC_MAP", REFIT_ENV_TEXT, 0, 0, NULL, REFIT_ENV_BY_SCRIPTS,                       \
    "set by refit-launch from --nic-map")                                                    \
  X("REFIT_SHOW_MAP", REFIT_ENV_INT, 0, 1, NULL, REFIT_ENV_BY_SCRIPTS,                       \
    "set by refit-launch from --show-map")                                                   \
  X("REFIT_ROOT", REFIT_ENV_TEXT, 0, 0, NULL, REFIT_ENV_BY_SCRIPTS,                          \
    "default: the Slurm submit directory")                                                   \
  X("REFIT_CUDA", REFIT_ENV_CHOICE, 0, 0, "AUTO|ON|OFF", REFIT_ENV_BY_SCRIPTS,               \
    "launch/bootstrap.sh: default AUTO")

typedef struct {
  const char *name;
  refit_env_kind_t kind;
  double lo, hi;
  const char *choices;
  refit_env_reader_t reader;
  const char *precedence;
} refit_env_var_t;

/* The table, `*n` rows. */
const refit_env_var_t *refit_env_vars(int *n);

/*
 * Read variable `name` (a row of the table; another name is
 * REFIT_ERR_INVALID_ARGUMENT). Unset or empty: *set = 0 and *out untouched.
 * Set: *set = 1 and the value, or REFIT_ERR_CONFIG naming the variable, its
 * value and what it must hold (nothing written then).
 *   refit_env_int      REFIT_ENV_INT rows
 *   refit_env_seconds  REFIT_ENV_SECONDS rows
 *   refit_env_choice   REFIT_ENV_CHOICE rows: *out = the choice's index
 *   refit_env_text     REFIT_ENV_TEXT rows: *out points into the environment
 */
refit_status_t refit_env_int(const char *name, int64_t *out, int *set);
refit_status_t refit_env_seconds(const char *name, double *out, int *set);
refit_status_t refit_env_choice(const char *name, int *out, int *set);
refit_status_t refit_env_text(const char *name, const char **out, int *set);

/* The same checks on a given text (what the variable would hold). */
refit_status_t refit_env_parse_seconds(const char *name, const char *text, double *out);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_CORE_ENV_H */

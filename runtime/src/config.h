/*
 * The refit configuration: one YAML file, parsed with libyaml against a
 * table of keys (name, type, default, bounds, doc). A bad file never starts a
 * transfer: every problem is collected and reported at once as
 * "file:line:col: message" lines.
 */
#ifndef REFIT_CONFIG_H
#define REFIT_CONFIG_H

#include "refit/status.h"
#include "reshard/layout.h"

#include <stddef.h>
#include <stdint.h>

typedef enum { REFIT_MODE_SYNC = 0, REFIT_MODE_ASYNC = 1 } refit_mode_t;

typedef enum {
  REFIT_TRANSPORT_AUTO = 0,
  REFIT_TRANSPORT_MPI,
  REFIT_TRANSPORT_NCCL,
  REFIT_TRANSPORT_IPC,
  REFIT_TRANSPORT_UCX
} refit_transport_kind_t;

typedef enum { REFIT_PRECISION_BF16 = 0, REFIT_PRECISION_MXFP8 = 1 } refit_precision_t;

typedef enum { REFIT_SOURCE_SYNTHETIC = 0, REFIT_SOURCE_HDF5 = 1 } refit_source_kind_t;

#define REFIT_PATH_MAX 1024

typedef struct {
  refit_model_t model;
  refit_trainer_layout_t trainer;
  refit_generator_layout_t generator;
  struct {
    refit_mode_t mode;                /* sync (default) | async */
    refit_transport_kind_t transport; /* auto (default) | mpi | nccl | ipc | ucx */
    uint64_t bucket_bytes;            /* default 256MiB; >= 1MiB */
    refit_precision_t precision;      /* bf16 (default) | mxfp8 */
    double timeout_s;                 /* default 300; > 0 */
    int steps;                        /* refits refit-run performs, default 3 */
  } refit;
  struct {
    refit_source_kind_t kind; /* synthetic (default) | hdf5 */
    uint64_t seed;            /* default 1234 */
    char path[REFIT_PATH_MAX];
  } source;
  int verify;                    /* default true */
  char dump[REFIT_PATH_MAX];     /* "" = no dump */
} refit_config_t;

/* Fill *cfg with every default. */
void refit_config_defaults(refit_config_t *cfg);

/*
 * Parse and validate YAML text. `filename` is used only in messages.
 * `world_size` is the number of MPI ranks the job runs with, or 0 to skip the
 * world-size check (refit-plan). On failure *errors (if not NULL) receives a
 * malloc'd string with one "file:line:col: message" per line, the caller
 * frees it, and the status is REFIT_ERR_CONFIG (REFIT_ERR_NOT_AVAILABLE when
 * the only problems are options that are not implemented yet). On success
 * *cfg is filled and *errors is NULL.
 */
refit_status_t refit_config_parse(const char *text, size_t len,
                                  const char *filename, int world_size,
                                  refit_config_t *cfg, char **errors);

/* Read a file and parse it (as above). *text_out (if not NULL) receives the
 * malloc'd file text, which the caller frees. */
refit_status_t refit_config_load(const char *path, int world_size,
                                 refit_config_t *cfg, char **errors,
                                 char **text_out, size_t *len_out);

/*
 * Parse a size such as "256MiB", "1GiB", "4096", "64KB": a decimal integer,
 * optionally followed (with or without a space) by B, KB, MB, GB, TB (powers
 * of 1000) or KiB, MiB, GiB, TiB (powers of 1024); unit letters are case
 * insensitive. Fractions, signs and overflow are errors (REFIT_ERR_CONFIG,
 * message in refit_last_error()). *bytes is set only on success.
 */
refit_status_t refit_config_parse_bytes(const char *text, uint64_t *bytes);

/*
 * Layers per trainer pipeline stage, from model.num_layers, trainer.pp and
 * trainer.first_stage_layers / last_stage_layers (0 = split evenly; the
 * stages not given split the remaining layers evenly). Fills layers[0..pp-1];
 * `n` is the capacity of `layers` and must be >= trainer.pp. The same rules
 * validate a configuration, so a parsed config never fails here.
 * Errors: REFIT_ERR_INVALID_ARGUMENT (n too small), REFIT_ERR_CONFIG.
 */
refit_status_t refit_config_stage_layers(const refit_config_t *cfg,
                                         int64_t *layers, int n);

/*
 * 64-bit FNV-1a over every configured value (key names included), so ranks
 * can prove they run the same configuration even when their files differ in
 * comments or formatting. Not a cryptographic hash.
 */
uint64_t refit_config_hash(const refit_config_t *cfg);

/*
 * The effective configuration (defaults filled in) as YAML that
 * refit_config_parse() reads back to an equal configuration. *out receives a
 * malloc'd NUL-terminated string that the caller frees.
 * Errors: REFIT_ERR_NO_MEMORY.
 */
refit_status_t refit_config_format(const refit_config_t *cfg, char **out);

#endif /* REFIT_CONFIG_H */

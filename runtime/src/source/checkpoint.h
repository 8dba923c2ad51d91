/*
 * Synthetic checkpoints: what refit_checkpoint_write (refit/refit.h) writes,
 * for a config already read (checkpoint.c).
 */
#ifndef REFIT_CHECKPOINT_H
#define REFIT_CHECKPOINT_H

#include "config/config.h"
#include "refit/refit.h"

/* refit_checkpoint_write over `cfg`, with `opt` already checked (dtype and
 * format in range, shards >= 1, and 1 for HDF5). *info is set on success. */
refit_status_t refit_checkpoint_write_config(const refit_config_t *cfg, const char *path,
                                             const refit_checkpoint_options_t *opt,
                                             refit_checkpoint_info_t *info);

#endif /* REFIT_CHECKPOINT_H */

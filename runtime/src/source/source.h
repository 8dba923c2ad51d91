/*
 * Where trainer weights come from. A source produces any rectangle of any
 * trainer tensor (global coordinates) for a version: trainers read their own
 * shard with it, and verification reads the expected rows of a runtime
 * tensor with it, so expected values always come from the global definition,
 * never from a gather of what was sent.
 */
#ifndef REFIT_SOURCE_H
#define REFIT_SOURCE_H

#include "config/config.h"
#include "kernels/synth_rules.h"
#include "reshard/catalog.h"

#include <stdint.h>

typedef struct {
  const char *name;
  refit_source_kind_t kind;
  /* Open for this catalog; check up front that every tensor exists with the
   * right shape and dtype (errors name the file, dataset, expected, actual). */
  refit_status_t (*open)(const refit_config_t *cfg, const refit_catalog_t *cat,
                         void **ctx);
  /* rows x cols of tensor `t` from global (row0, col0) as BF16 bits, row-major
   * with leading dimension `cols`. */
  refit_status_t (*read)(void *ctx, const refit_src_tensor_t *t,
                         uint64_t version, int64_t row0, int64_t col0,
                         int64_t rows, int64_t cols, uint16_t *dst);
  void (*close)(void *ctx);
  /* Optional: when every element of tensor `t` in `version` is
   * refit_synth_value(key, row * t->cols + col) (kernels/synth_rules.h),
   * say so; device memory is then filled on the device instead of through a
   * host copy. NULL for sources that read data. */
  refit_status_t (*synth_key)(void *ctx, const refit_src_tensor_t *t, uint64_t version,
                              refit_synth_key_t *key);
} refit_source_ops_t;

typedef struct {
  const refit_source_ops_t *ops;
  void *ctx;
} refit_source_t;

refit_status_t refit_source_open(const refit_config_t *cfg,
                                 const refit_catalog_t *cat, refit_source_t *out);
void refit_source_close(refit_source_t *src);

extern const refit_source_ops_t refit_source_synthetic;

/* For checkpoint sources' read(): *index = tensor t's index in cat->hf
 * (looked up by name when t is not one of cat->hf), and the rectangle
 * within t's shape; errors name the checkpoint `path` and the tensor. */
refit_status_t refit_source_check_rect(const refit_catalog_t *cat, const char *path,
                                       const refit_src_tensor_t *t, int64_t row0,
                                       int64_t col0, int64_t rows, int64_t cols,
                                       int64_t *index);

/* Units [col0, col0 + cols) of an FP32 vector (REFIT_ROLE_F32: float32
 * element k is 2-byte units 2k, low half, and 2k + 1) from its float32 bits
 * `words`. */
void refit_source_f32_units(const uint32_t *words, int64_t col0, int64_t cols,
                            uint16_t *dst);

#endif /* REFIT_SOURCE_H */

#include "source/source.h"

#include "core/error.h"
#include "kernels/datapath.h"
#include "source/synth.h"

#include <stdlib.h>

extern const refit_source_ops_t refit_source_hdf5;        /* source_hdf5.c */
extern const refit_source_ops_t refit_source_safetensors; /* source_safetensors.c */

/* Compiled-in sources, by refit_source_kind_t. */
static const refit_source_ops_t *const refit_sources[] = {
    &refit_source_synthetic,
    &refit_source_hdf5,
    &refit_source_safetensors,
};

refit_status_t refit_source_open(const refit_config_t *cfg,
                                 const refit_catalog_t *cat,
                                 refit_source_t *out) {
  const size_t n = sizeof(refit_sources) / sizeof(refit_sources[0]);
  for (size_t i = 0; i < n; i++) {
    if (refit_sources[i]->kind != cfg->source.kind)
      continue;
    REFIT_CHECK(refit_sources[i]->open(cfg, cat, &out->ctx));
    out->ops = refit_sources[i];
    return REFIT_OK;
  }
  return REFIT_ERR(REFIT_ERR_NOT_AVAILABLE,
                   "source.kind %d is not built into this refit",
                   (int)cfg->source.kind);
}

void refit_source_close(refit_source_t *src) {
  if (src->ops != NULL)
    src->ops->close(src->ctx);
  src->ops = NULL;
  src->ctx = NULL;
}

/* The synthetic source: values are a function of (seed, version, name,
 * global index), independent per version or updates of a master at
 * source.update_rate; see synth.h. */
typedef struct {
  uint64_t seed;
  double rate;
} refit_synth_source_t;

static refit_status_t refit_synth_open(const refit_config_t *cfg,
                                       const refit_catalog_t *cat, void **ctx) {
  (void)cat;
  refit_synth_source_t *s = malloc(sizeof(*s));
  if (s == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "synthetic source");
  s->seed = cfg->source.seed;
  s->rate = cfg->source.update_rate;
  *ctx = s;
  return REFIT_OK;
}

static refit_status_t refit_synth_read(void *ctx, const refit_src_tensor_t *t,
                                       uint64_t version, int64_t row0,
                                       int64_t col0, int64_t rows, int64_t cols,
                                       uint16_t *dst) {
  refit_synth_source_t *s = ctx;
  refit_synth_key_t key;
  refit_synth_init(&key, s->seed, s->rate, version, t);
  refit_synth_rect(&key, t->cols, row0, col0, rows, cols, dst);
  return REFIT_OK;
}

static refit_status_t refit_synth_key(void *ctx, const refit_src_tensor_t *t,
                                      uint64_t version, refit_synth_key_t *key) {
  refit_synth_source_t *s = ctx;
  refit_synth_init(key, s->seed, s->rate, version, t);
  return REFIT_OK;
}

static void refit_synth_close(void *ctx) { free(ctx); }

const refit_source_ops_t refit_source_synthetic = {
    .name = "synthetic",
    .kind = REFIT_SOURCE_SYNTHETIC,
    .open = refit_synth_open,
    .read = refit_synth_read,
    .close = refit_synth_close,
    .synth_key = refit_synth_key,
};

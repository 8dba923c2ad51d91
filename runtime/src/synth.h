/*
 * Synthetic weights: every element is a pure function of (seed, version,
 * tensor name, global element index), so any rank can compute the expected
 * value of any element without a gather, and every refit sends new values.
 * Magnitudes are realistic: projections and experts mostly within 2^-12 ..
 * 2^-5 with rare larger outliers, norms in [1, 2).
 */
#ifndef REFIT_SYNTH_H
#define REFIT_SYNTH_H

#include "kernels/synth_rules.h"
#include "reshard/catalog.h"

#include <stdint.h>

typedef struct {
  uint64_t key; /* mixes seed, version and tensor name */
  int norm;     /* norms get values in [1, 2) */
} refit_synth_t;

void refit_synth_init(refit_synth_t *s, uint64_t seed, uint64_t version,
                      const refit_src_tensor_t *tensor);

/* A tensor's key for refit_synth_value (kernels/synth_rules.h); filling
 * rectangles is refit_synth_rect and its CUDA twin (kernels/datapath.h). */

#endif /* REFIT_SYNTH_H */

/*
 * Synthetic weights: every element is a pure function of (seed, version,
 * tensor name, global element index), so any rank can compute the expected
 * value of any element of any version in O(1), without a gather and without
 * the versions before it. Magnitudes are realistic: projections and experts
 * mostly within 2^-12 .. 2^-5 with rare larger outliers, norms in [1, 2)
 * (with an update rate, the masters are; versions move by up to r of them).
 * kernels/synth_rules.h holds the exact definition, shared by host and device.
 *
 * source.update_rate 0 (the default): versions are independent, every refit
 * sends new values everywhere.
 *
 * source.update_rate r > 0: a training-like stream. Each element has an FP32
 * master m (seed and name only, the same in every version) and version v
 * holds bf16(m + r * |m| * n_v), n_v = +-u with u uniform in [0, 1) drawn
 * afresh for each version. The model is that of mixed-precision training,
 * where the optimizer updates an FP32 master and the BF16 copy the refit
 * sends changes only when the master crosses a BF16 rounding boundary:
 * AdamW's step is about lr in magnitude whatever the gradient's scale (Adam
 * divides by the gradient's running RMS), so r plays the role of lr / |w|,
 * and making the step relative to |m| gives every tensor, whatever its
 * magnitude, the same fraction of changed elements. A boundary lies between
 * two versions' values with probability min(1, |d| / ulp), d = r |m|
 * (n_v - n_w) and ulp = 2^-7 of m's binade, so about 128 r of the BF16
 * elements change between any two versions for r up to 1/512 (E|n_v - n_w|
 * = 2/3, E of m's significand = 3/2); r ~ 1e-4 gives the 1 % per step the
 * issue "Delta refit" measured at lr 1e-6 and published RL runs report.
 *
 * What it does not model: drift. The master never moves, so version v
 * differs from v - 1 exactly as much as from v - 100, where a real master
 * walks away from where it was; nor do consecutive updates correlate (Adam's
 * momentum gives them the same sign), nor do some rows move less than
 * others (an expert no token was routed to, or the embedding rows of tokens
 * a batch did not hold, move by weight decay only), nor does the rate differ
 * between tensors or layers. What it gives is the rate of changed BF16 (and
 * hence MXFP8) bytes per refit with no structure, which is what a delta
 * codec's cost depends on, while staying random-access: verification
 * recomputes any version from scratch.
 */
#ifndef REFIT_SYNTH_H
#define REFIT_SYNTH_H

#include "kernels/synth_rules.h"
#include "reshard/catalog.h"

#include <stdint.h>

/* The key of `tensor`'s values in `version` (refit_synth_value); `rate` is
 * source.update_rate, used in FP32. Filling rectangles is refit_synth_rect
 * and its CUDA twin (kernels/datapath.h). */
void refit_synth_init(refit_synth_key_t *k, uint64_t seed, double rate, uint64_t version,
                      const refit_src_tensor_t *tensor);

#endif /* REFIT_SYNTH_H */

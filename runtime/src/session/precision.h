/*
 * Which runtime tensors are MXFP8: what the engine registers decides, as
 * NeMo-RL decides it from vLLM's parameters (an e4m3 weight with its scale
 * is quantized, a BF16 one is not). Where the engine registers nothing,
 * refit allocates the storage and the config decides (refit.precision,
 * refit.quantization_ignore).
 *
 * Before the first refit_begin a generator registration that is the other
 * precision's form of a runtime tensor (a BF16 weight where the config
 * quantizes, an e4m3 weight or its E8M0 scale where it does not) is kept
 * aside with its form; at the first begin every rank's forms are reduced
 * (collective), the catalog's `quantized` flags follow them, and the session
 * re-plans and checks every registration again against the new stores.
 */
#ifndef REFIT_PRECISION_H
#define REFIT_PRECISION_H

#include "config/config.h"
#include "generator/loader.h"
#include "refit/refit.h"

/* A registration's form, as bits of a tensor's vote (reduced with OR). */
enum {
  REFIT_FORM_BF16 = 1,    /* BF16 where the config quantizes */
  REFIT_FORM_MXFP8 = 2,   /* e4m3 weight or E8M0 scale where it does not */
  REFIT_FORM_PLANNED = 4  /* as refit planned it */
};

/*
 * The form registration `t` takes when it does not match the stores as
 * planned: `found` is the store of its name (NULL when none has it).
 * Returns REFIT_FORM_BF16 or REFIT_FORM_MXFP8 and the catalog tensor in
 * *gen, or 0 when `t` is no other form (an ordinary registration problem).
 */
int refit_precision_form(const refit_config_t *cfg, const refit_catalog_t *cat,
                         const refit_store_t *stores, int64_t nstores,
                         const refit_store_t *found, const refit_tensor_t *t,
                         int64_t *gen);

/*
 * From every rank's votes, OR-reduced (one byte per catalog generator
 * tensor), set cat->gen[].quantized: *to_bf16 and *to_mxfp8 count the
 * tensors that change. Fails, changing nothing, when engines disagree about
 * a tensor or one asks to quantize a tensor refit cannot quantize
 * (refit_config_check_quantizable), naming the tensors. Every rank decides
 * the same from the same votes.
 */
refit_status_t refit_precision_decide(const refit_config_t *cfg, refit_catalog_t *cat,
                                      const unsigned char *votes, int64_t *to_bf16,
                                      int64_t *to_mxfp8);

#endif /* REFIT_PRECISION_H */

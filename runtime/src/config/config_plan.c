/*
 * The rules between a refit configuration and its plan (config.h), checked
 * once the job has planned: what the planner decided per tensor that a key
 * cannot take. Kept apart from config_rules.c, whose rules run on the keys
 * alone (and which the config fuzz harness builds without the planner).
 */
#include "config/config.h"

#include "config/config_rules.h"
#include "core/error.h"
#include "reshard/plan.h"

#include <stdio.h>

bool refit_config_block_fallback(const refit_catalog_t *cat, const refit_plan_t *plan,
                                 char *why, size_t len) {
  const int64_t first = refit_plan_block_fallback(plan, cat, 0);
  if (first < 0)
    return false;
  int64_t fall = 0, all = 0;
  for (int64_t i = 0; i < cat->gen_begin[cat->generator.tp]; i++) {
    all += cat->gen[i].quantized == REFIT_QUANT_FP8_BLOCK;
    fall += cat->gen[i].quantized == REFIT_QUANT_FP8_BLOCK &&
            !refit_plan_block_prequantized(plan, i);
  }
  int rank = 0;
  while (first >= cat->gen_begin[rank + 1])
    rank++;
  char reason[512], tensor[REFIT_NAME_MAX + 8];
  if (refit_plan_block_why(plan, cat, first, reason, sizeof(reason)) != REFIT_OK)
    snprintf(reason, sizeof(reason), "%s", refit_last_error());
  refit_config_tensor_pattern(cat->gen[first].name, tensor, sizeof(tensor));
  snprintf(why, len,
           "%s on generator tp rank %d (%lld of the %lld block FP8 tensors of the "
           "generator's tp ranks) travels BF16 under refit.prequantize and is quantized "
           "on the generator, where no delta applies in place: %s",
           tensor, rank, (long long)fall, (long long)all, reason);
  return true;
}

refit_status_t refit_config_plan_check(const refit_config_t *cfg,
                                       const refit_catalog_t *cat,
                                       const refit_plan_t *plan) {
  char why[1024];
  if (cfg->refit.delta == REFIT_DELTA_MODE_ON &&
      refit_config_block_fallback(cat, plan, why, sizeof(why)))
    return REFIT_ERR(
        REFIT_ERR_CONFIG,
        "refit.delta: on: %s; make every trainer shard of such a tensor whole "
        "128 x 128 blocks (trainer.tp) or its cut fit refit.bucket_bytes, "
        "or set delta: auto (full refits for this layout) or delta: off",
        why);
  return REFIT_OK;
}

/*
 * refit/plan.h over the configuration (config.h) and the planner
 * (reshard/catalog.h, reshard/plan.h): the same calls a session makes at
 * open, with the figures copied out of the planner's tables.
 */
#include "refit/plan.h"

#include "config/config.h"
#include "core/error.h"
#include "reshard/plan.h"

#include <stdlib.h>

struct refit_plan_report_s {
  refit_config_t cfg;
  refit_catalog_t *cat; /* NULL until built */
  refit_plan_t *plan;
};

refit_status_t refit_plan_report_open(const char *config_path, refit_plan_report_h *out,
                                      char **errors) {
  if (errors)
    *errors = NULL;
  if (config_path == NULL || out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit_plan_report_open: NULL config_path or out");
  refit_plan_report_h r = calloc(1, sizeof(*r));
  if (r == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "refit_plan_report_open: out of memory");
  const refit_status_t st =
      refit_config_load(config_path, 0, &r->cfg, errors, NULL, NULL);
  if (st != REFIT_OK) {
    free(r);
    return st;
  }
  *out = r;
  return REFIT_OK;
}

refit_status_t refit_plan_report_world(refit_plan_report_h r, int *trainers,
                                       int *generators) {
  if (r == NULL || trainers == NULL || generators == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit_plan_report_world: NULL argument");
  *trainers = refit_trainer_world(&r->cfg.trainer);
  *generators = refit_generator_world(&r->cfg.generator);
  return REFIT_OK;
}

refit_status_t refit_plan_report_build(refit_plan_report_h r) {
  if (r == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "refit_plan_report_build: NULL report");
  if (r->cat != NULL)
    return REFIT_ERR(REFIT_ERR_STATE, "refit_plan_report_build: already built");
  refit_plan_options_t opt;
  refit_catalog_t *cat = NULL;
  refit_plan_t *plan = NULL;
  refit_config_plan_options(&r->cfg, &opt);
  refit_status_t st =
      refit_catalog_create(&r->cfg.model, &r->cfg.trainer, &r->cfg.generator, &cat);
  if (st != REFIT_OK)
    return st;
  refit_config_mark_quantized(&r->cfg, cat);
  st = refit_plan_create(cat, &opt, &plan);
  if (st == REFIT_OK)
    st = refit_config_plan_check(&r->cfg, cat, plan);
  if (st != REFIT_OK) {
    refit_plan_destroy(plan);
    refit_catalog_destroy(cat);
    return st;
  }
  r->cat = cat;
  r->plan = plan;
  return REFIT_OK;
}

/* The checks every query of a built plan makes. */
static refit_status_t refit_plan_report_built(refit_plan_report_h r, const void *out,
                                              const char *fn) {
  if (r == NULL || out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (r->plan == NULL)
    return REFIT_ERR(REFIT_ERR_STATE,
                     "%s: the plan is not built (refit_plan_report_build)", fn);
  return REFIT_OK;
}

refit_status_t refit_plan_report_figures(refit_plan_report_h r,
                                         refit_plan_figures_t *out) {
  REFIT_CHECK(refit_plan_report_built(r, out, __func__));
  const refit_catalog_t *cat = r->cat;
  refit_plan_figures_t f = {0};
  f.trainers = refit_trainer_world(&r->cfg.trainer);
  f.generators = refit_generator_world(&r->cfg.generator);
  for (int64_t i = 0; i < cat->nhf; i++)
    f.parameters += refit_src_elements(&cat->hf[i]);
  f.trainer_tensors = cat->nsrc;
  f.chunks = r->plan->nchunks;
  f.messages = r->plan->nmsgs;
  f.buckets = r->plan->nbuckets;
  f.bucket_bytes = r->cfg.refit.bucket_bytes;
  f.mxfp8 = r->cfg.refit.precision == REFIT_PRECISION_MXFP8;
  f.arena_bound = r->cfg.refit.arena_bytes;
  f.spread = r->plan->spread;
  f.hash = r->plan->hash;
  f.delta = (int)r->cfg.refit.delta;
  f.delta_baseline = (int)r->cfg.refit.delta_baseline;
  for (int32_t t = 0; f.delta != REFIT_DELTA_MODE_OFF && t < r->plan->ntrainer; t++) {
    const int64_t bytes = refit_plan_packed_bytes(r->plan, cat, t);
    f.delta_trainer_bytes = bytes > f.delta_trainer_bytes ? bytes : f.delta_trainer_bytes;
  }
  /* Generators keep no baseline: they apply deltas in place (delta_wire.h)
   * and keep two digests (committed, candidate) per chunk they land. */
  for (int32_t g = 0; f.delta != REFIT_DELTA_MODE_OFF && g < r->plan->ngenerator; g++) {
    int64_t chunks = 0;
    for (int64_t c = 0; c < r->plan->nchunks; c++)
      chunks += r->plan->chunks[c].dst_rank == g;
    if (16 * chunks > f.delta_generator_bytes)
      f.delta_generator_bytes = 16 * chunks;
  }
  *out = f;
  return REFIT_OK;
}

refit_status_t refit_plan_report_predict(refit_plan_report_h r,
                                         const refit_plan_links_t *links,
                                         refit_plan_prediction_t *out) {
  REFIT_CHECK(refit_plan_report_built(r, out, __func__));
  if (links == NULL || !(links->link_gbps > 0))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit_plan_report_predict: NULL links or link_gbps not positive");
  const refit_plan_network_t net = {.link_gbps = links->link_gbps,
                                    .nvlink_gbps = links->nvlink_gbps,
                                    .gpus_per_node = links->gpus_per_node};
  refit_plan_stats_t s;
  refit_plan_predict(r->plan, &net, &s);
  *out = (refit_plan_prediction_t){
      .total_bytes = s.total_bytes,
      .egress_max = s.egress_max,
      .ingress_max = s.ingress_max,
      .egress_mean = s.egress_mean,
      .ingress_mean = s.ingress_mean,
      .staging_max = s.staging_max,
      .arena_max = s.arena_max,
      .floor_s = s.floor_s,
      .predicted_s = s.predicted_s,
      .bucket_egress_imbalance = s.bucket_egress_imbalance,
      .bucket_ingress_imbalance = s.bucket_ingress_imbalance,
  };
  return REFIT_OK;
}

refit_status_t refit_plan_report_pipeline(refit_plan_report_h r,
                                          const refit_plan_links_t *links,
                                          const refit_plan_copy_t *copy,
                                          refit_plan_bucket_t *buckets,
                                          refit_plan_pipeline_prediction_t *out) {
  REFIT_CHECK(refit_plan_report_built(r, out, __func__));
  if (links == NULL || copy == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit_plan_report_pipeline: NULL links or copy");
  const refit_config_t *cfg = &r->cfg;
  refit_plan_overlap_t overlap = copy->overlap;
  const int host = cfg->refit.transport == REFIT_TRANSPORT_MPI ||
                   cfg->refit.device_map == REFIT_DEVICE_MAP_NONE;
  if (overlap == REFIT_PLAN_OVERLAP_AUTO)
    overlap = !host                                         ? REFIT_PLAN_OVERLAP_FULL
              : cfg->refit.transport == REFIT_TRANSPORT_UCX ? REFIT_PLAN_OVERLAP_NONE
                                                            : REFIT_PLAN_OVERLAP_PACK;
  const refit_plan_network_t net = {.link_gbps = links->link_gbps,
                                    .nvlink_gbps = links->nvlink_gbps,
                                    .gpus_per_node = links->gpus_per_node};
  const int async = cfg->refit.mode == REFIT_MODE_ASYNC;
  const refit_plan_passes_t passes = {
      .copy_gbps = copy->copy_gbps,
      .progress = overlap == REFIT_PLAN_OVERLAP_NONE   ? REFIT_PLAN_PROGRESS_BOTH
                  : overlap == REFIT_PLAN_OVERLAP_PACK ? REFIT_PLAN_PROGRESS_RECEIVER
                                                       : REFIT_PLAN_PROGRESS_ASYNC,
      .save = !async && cfg->refit.restore == REFIT_RESTORE_FULL,
      .commit_copy = async};
  const int32_t nb = r->plan->nbuckets;
  refit_plan_bucket_prediction_t *b = malloc((size_t)(nb > 0 ? nb : 1) * sizeof(*b));
  if (b == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "refit_plan_report_pipeline: %d buckets",
                     (int)nb);
  refit_plan_pipeline_t pl;
  const refit_status_t st =
      refit_plan_predict_passes(r->plan, r->cat, &net, &passes, b, &pl);
  for (int32_t i = 0; st == REFIT_OK && buckets != NULL && i < nb; i++)
    buckets[i] = (refit_plan_bucket_t){.pack_bytes = b[i].pack_bytes,
                                       .land_bytes = b[i].land_bytes,
                                       .save_bytes = b[i].save_bytes,
                                       .pack_s = b[i].pack_s,
                                       .transfer_s = b[i].transfer_s,
                                       .land_s = b[i].land_s,
                                       .pack_end_s = b[i].pack_end_s,
                                       .transfer_end_s = b[i].transfer_end_s,
                                       .land_end_s = b[i].land_end_s};
  free(b);
  if (st != REFIT_OK)
    return st;
  *out = (refit_plan_pipeline_prediction_t){.pack_s = pl.pack_s,
                                            .transfer_s = pl.transfer_s,
                                            .land_s = pl.land_s,
                                            .save_bytes = pl.save_bytes,
                                            .commit_s = pl.commit_s,
                                            .total_s = pl.total_s,
                                            .overlap = overlap};
  return REFIT_OK;
}

refit_status_t refit_plan_report_rank_bytes(refit_plan_report_h r, refit_plan_side_t side,
                                            int rank, int64_t *bytes) {
  REFIT_CHECK(refit_plan_report_built(r, bytes, __func__));
  const int trainer = side == REFIT_PLAN_SIDE_TRAINER;
  const int n = trainer ? r->plan->ntrainer : r->plan->ngenerator;
  if ((!trainer && side != REFIT_PLAN_SIDE_GENERATOR) || rank < 0 || rank >= n)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit_plan_report_rank_bytes: side %d rank %d (%d ranks on it)",
                     (int)side, rank, n);
  *bytes = trainer ? r->plan->egress[rank] : r->plan->ingress[rank];
  return REFIT_OK;
}

void refit_plan_report_close(refit_plan_report_h r) {
  if (r == NULL)
    return;
  refit_plan_destroy(r->plan);
  refit_catalog_destroy(r->cat);
  free(r);
}

/*
 * The model shape and the two parallel layouts that the planner works from.
 * These are plain values; runtime/src/config.c fills them from YAML and
 * validates them (layout rules below), reshard/ turns them into tensors and a
 * plan.
 *
 * Layout rules (../shared/reference/sharding.md):
 * - trainer ranks T = tp * pp * dp; expert layers re-view each stage's tp*dp
 *   ranks as etp * ep * edp, so etp*ep must divide tp*dp.
 * - generator ranks G = engines * tp; ep is 1 or tp.
 */
#ifndef REFIT_RESHARD_LAYOUT_H
#define REFIT_RESHARD_LAYOUT_H

#include "refit/status.h"

#include <stdint.h>

typedef enum {
  REFIT_FAMILY_QWEN3 = 0,    /* dense MLP */
  REFIT_FAMILY_QWEN3_MOE = 1 /* routed experts, no shared expert */
} refit_family_t;

typedef struct {
  refit_family_t family;
  int64_t hidden_size;           /* H */
  int64_t num_layers;            /* L */
  int64_t num_attention_heads;   /* Q */
  int64_t num_kv_heads;          /* KV */
  int64_t head_dim;              /* D */
  int64_t vocab_size;            /* V */
  int64_t intermediate_size;     /* F, dense MLP (qwen3) */
  int64_t num_experts;           /* X (qwen3_moe) */
  int64_t moe_intermediate_size; /* I (qwen3_moe) */
  int tie_word_embeddings;       /* no lm_head.weight when set */
} refit_model_t;

typedef struct {
  int tp, pp, ep, etp, dp;
  /* Layers on the first and last pipeline stage; 0 means "split evenly". */
  int64_t first_stage_layers;
  int64_t last_stage_layers;
} refit_trainer_layout_t;

typedef struct {
  int tp;      /* ranks per engine */
  int ep;      /* 1 (experts TP-sharded) or tp (experts split over ranks) */
  int engines; /* independent replicas, each needs the whole model */
} refit_generator_layout_t;

static inline int refit_trainer_world(const refit_trainer_layout_t *t) {
  return t->tp * t->pp * t->dp;
}

static inline int refit_generator_world(const refit_generator_layout_t *g) {
  return g->tp * g->engines;
}

#endif /* REFIT_RESHARD_LAYOUT_H */

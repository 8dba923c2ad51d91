/*
 * The model shape and the two parallel layouts that the planner works from.
 * These are plain values; runtime/src/config*.c fill them from YAML,
 * reshard/rules.h checks them (the layout rules, summed up below), reshard/
 * turns them into tensors and a plan.
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

/* The families; what each holds is its row of reshard/family.h. The values
 * are the order of model.family's choices and stay fixed (configs hash
 * them). */
typedef enum {
  REFIT_FAMILY_QWEN3 = 0,      /* dense MLP, q/k norms */
  REFIT_FAMILY_QWEN3_MOE = 1,  /* routed experts, no shared expert, q/k norms */
  REFIT_FAMILY_LLAMA = 2,      /* dense MLP, no q/k norms, no biases */
  REFIT_FAMILY_QWEN2 = 3,      /* dense MLP, q/k/v biases, no q/k norms */
  REFIT_FAMILY_DEEPSEEK_V3 = 4 /* MLA, dense first layers, routed and shared experts */
} refit_family_t;

typedef struct {
  refit_family_t family;
  int64_t hidden_size;           /* H */
  int64_t num_layers;            /* L */
  int64_t num_attention_heads;   /* Q */
  int64_t num_kv_heads;          /* KV */
  int64_t head_dim;              /* D */
  int64_t vocab_size;            /* V */
  int64_t intermediate_size;     /* F, dense MLP (dense families) */
  int64_t num_experts;           /* X (qwen3_moe, deepseek_v3) */
  int64_t moe_intermediate_size; /* I (qwen3_moe, deepseek_v3) */
  int tie_word_embeddings;       /* no lm_head.weight when set */
  /* Multi-head latent attention (deepseek_v3). head_dim is then the rope
   * head dimension R (qk_rope_head_dim) and num_kv_heads equals
   * num_attention_heads N: MLA has no KV heads of its own. */
  int64_t q_lora_rank;      /* q_r; 0: q_proj instead of q_a / q_b */
  int64_t kv_lora_rank;     /* kv_r */
  int64_t qk_nope_head_dim; /* P */
  int64_t v_head_dim;       /* Vd */
  /* DeepSeek's MoE layers (deepseek_v3): layer l has routed experts iff
   * l >= first_k_dense_replace and l % moe_layer_freq == 0 (0 reads as 1),
   * else a dense MLP of intermediate_size; every MoE layer has
   * num_shared_experts shared experts, one MLP of num_shared_experts *
   * moe_intermediate_size rows. */
  int64_t num_shared_experts;
  int64_t first_k_dense_replace;
  int64_t moe_layer_freq;
  /* Every MoE layer's router has e_score_correction_bias, FP32 [X]
   * (topk_method noaux_tc: DeepSeek-V3, R1, Kimi-K2; Megatron's
   * mlp.router.expert_bias buffer) (deepseek_v3). */
  int expert_bias;
} refit_model_t;

/* How the trainer names and fuses its tensors. */
typedef enum {
  REFIT_TRAINER_NAMES_AUTO = 0,    /* config only: megatron for source caller */
  REFIT_TRAINER_NAMES_HF = 1,      /* Hugging Face names, one tensor per
                                      projection and per expert */
  REFIT_TRAINER_NAMES_MEGATRON = 2 /* Megatron-Core named_parameters() */
} refit_trainer_names_t;

/* Megatron-Core layer spec: Transformer Engine modules fuse the norms into
 * the following linear layer; the local spec keeps them apart. */
typedef enum { REFIT_SPEC_TE = 0, REFIT_SPEC_LOCAL = 1 } refit_trainer_spec_t;

/* Megatron-Core expert modules: TEGroupedMLP (weight{k}) or SequentialMLP
 * (local_experts.{k}). AUTO: grouped with the TE spec, sequential with the
 * local one. */
typedef enum {
  REFIT_EXPERTS_AUTO = 0,
  REFIT_EXPERTS_GROUPED = 1,
  REFIT_EXPERTS_SEQUENTIAL = 2
} refit_trainer_experts_t;

#define REFIT_NAME_PREFIX_MAX 32

typedef struct {
  int tp, pp, ep, etp, dp;
  /* Layers on the first and last pipeline stage; 0 means "split evenly". */
  int64_t first_stage_layers;
  int64_t last_stage_layers;
  /* Naming (refit_trainer_names_t), spec and expert module of a Megatron
   * trainer, the prefix training wrappers add ("module.module."), and
   * Megatron's vocabulary padding: V is padded to a multiple of
   * vocab_divisible_by * tp (make_vocab_size_divisible_by). */
  int names;
  int spec;
  int experts;
  char name_prefix[REFIT_NAME_PREFIX_MAX];
  int64_t vocab_divisible_by;
} refit_trainer_layout_t;

typedef struct {
  int tp;      /* ranks per engine */
  int ep;      /* 1 (experts TP-sharded) or tp (experts split over ranks) */
  int engines; /* independent replicas, each needs the whole model */
} refit_generator_layout_t;

/*
 * The fields above that the layout rules (reshard/rules.h) read, so that a
 * broken rule can say which one to change. The name is the field's path,
 * which is also its key in the YAML config ("trainer.tp"); config_rules.c finds
 * the key by it.
 */
#define REFIT_FIELDS(X)                                                                  \
  X(MODEL_FAMILY, "model.family", model, family)                                         \
  X(MODEL_HIDDEN_SIZE, "model.hidden_size", model, hidden_size)                          \
  X(MODEL_NUM_LAYERS, "model.num_layers", model, num_layers)                             \
  X(MODEL_NUM_ATTENTION_HEADS, "model.num_attention_heads", model, num_attention_heads)  \
  X(MODEL_NUM_KV_HEADS, "model.num_kv_heads", model, num_kv_heads)                       \
  X(MODEL_HEAD_DIM, "model.head_dim", model, head_dim)                                   \
  X(MODEL_VOCAB_SIZE, "model.vocab_size", model, vocab_size)                             \
  X(MODEL_INTERMEDIATE_SIZE, "model.intermediate_size", model, intermediate_size)        \
  X(MODEL_NUM_EXPERTS, "model.num_experts", model, num_experts)                          \
  X(MODEL_MOE_INTERMEDIATE_SIZE, "model.moe_intermediate_size", model,                   \
    moe_intermediate_size)                                                               \
  X(MODEL_TIE_WORD_EMBEDDINGS, "model.tie_word_embeddings", model, tie_word_embeddings)  \
  X(MODEL_Q_LORA_RANK, "model.q_lora_rank", model, q_lora_rank)                          \
  X(MODEL_KV_LORA_RANK, "model.kv_lora_rank", model, kv_lora_rank)                       \
  X(MODEL_QK_NOPE_HEAD_DIM, "model.qk_nope_head_dim", model, qk_nope_head_dim)           \
  X(MODEL_V_HEAD_DIM, "model.v_head_dim", model, v_head_dim)                             \
  X(MODEL_NUM_SHARED_EXPERTS, "model.num_shared_experts", model, num_shared_experts)     \
  X(MODEL_FIRST_K_DENSE_REPLACE, "model.first_k_dense_replace", model,                   \
    first_k_dense_replace)                                                               \
  X(MODEL_MOE_LAYER_FREQ, "model.moe_layer_freq", model, moe_layer_freq)                 \
  X(MODEL_EXPERT_BIAS, "model.expert_bias", model, expert_bias)                          \
  X(TRAINER_TP, "trainer.tp", trainer, tp)                                               \
  X(TRAINER_PP, "trainer.pp", trainer, pp)                                               \
  X(TRAINER_EP, "trainer.ep", trainer, ep)                                               \
  X(TRAINER_ETP, "trainer.etp", trainer, etp)                                            \
  X(TRAINER_DP, "trainer.dp", trainer, dp)                                               \
  X(TRAINER_FIRST_STAGE_LAYERS, "trainer.first_stage_layers", trainer,                   \
    first_stage_layers)                                                                  \
  X(TRAINER_LAST_STAGE_LAYERS, "trainer.last_stage_layers", trainer, last_stage_layers)  \
  X(TRAINER_LAYOUT, "trainer.layout", trainer, names)                                    \
  X(TRAINER_SPEC, "trainer.spec", trainer, spec)                                         \
  X(TRAINER_EXPERTS, "trainer.experts", trainer, experts)                                \
  X(TRAINER_VOCAB_DIVISIBLE_BY, "trainer.vocab_divisible_by", trainer,                   \
    vocab_divisible_by)                                                                  \
  X(GENERATOR_TP, "generator.tp", generator, tp)                                         \
  X(GENERATOR_EP, "generator.ep", generator, ep)                                         \
  X(GENERATOR_ENGINES, "generator.engines", generator, engines)

typedef enum {
  REFIT_FIELD_NONE = 0,
#define REFIT_FIELD_ENUM_(id, name, side, member) REFIT_FIELD_##id,
  REFIT_FIELDS(REFIT_FIELD_ENUM_)
#undef REFIT_FIELD_ENUM_
      REFIT_FIELD_COUNT
} refit_field_t;

/* Ranks of each side, in 64 bits: the config bounds each size, not their
 * product, to what an int holds. */
static inline int64_t refit_trainer_world(const refit_trainer_layout_t *t) {
  return (int64_t)t->tp * t->pp * t->dp;
}

static inline int64_t refit_generator_world(const refit_generator_layout_t *g) {
  return (int64_t)g->tp * g->engines;
}

#endif /* REFIT_RESHARD_LAYOUT_H */

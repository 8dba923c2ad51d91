#include "reshard/reference.h"

#include "core/error.h"

#include <stdio.h>
#include <string.h>

static int refit_ref_is(const char *rest, const char *suffix) {
  return strcmp(rest, suffix) == 0;
}

refit_status_t refit_reference_source_row(const refit_model_t *m,
                                          const refit_generator_layout_t *gen,
                                          int t, const char *name, int64_t row,
                                          char src_name[REFIT_NAME_MAX],
                                          int64_t *src_row, int64_t *col_offset) {
  const int64_t tp = gen->tp;
  const int64_t D = m->head_dim, H = m->hidden_size;
  const int64_t q_rows = m->num_attention_heads / tp * D;
  int layer = -1;
  int consumed = 0;

  *col_offset = 0;
  if (strcmp(name, "model.embed_tokens.weight") == 0 ||
      strcmp(name, "lm_head.weight") == 0) {
    /* VocabParallelEmbedding / ParallelLMHead (vllm 0.25,
     * model_executor/layers/vocab_parallel_embedding.py): the vocabulary is
     * padded to a multiple of 64 and every rank holds padded / tp rows. */
    const int64_t padded = (m->vocab_size + 63) / 64 * 64;
    const int64_t v = t * (padded / tp) + row;
    snprintf(src_name, REFIT_NAME_MAX, "%s", name);
    *src_row = v < m->vocab_size ? v : -1;
    return REFIT_OK;
  }
  if (strcmp(name, "model.norm.weight") == 0) {
    snprintf(src_name, REFIT_NAME_MAX, "%s", name);
    *src_row = 0;
    return REFIT_OK;
  }
  if (sscanf(name, "model.layers.%d.%n", &layer, &consumed) != 1 || consumed == 0)
    goto unknown;
  const char *rest = name + consumed;
  char prefix[48];
  snprintf(prefix, sizeof(prefix), "model.layers.%d.", layer);

#define REFIT_SRC(fmt, ...)                                                    \
  snprintf(src_name, REFIT_NAME_MAX, "%s" fmt, prefix, __VA_ARGS__)

  if (refit_ref_is(rest, "input_layernorm.weight") ||
      refit_ref_is(rest, "post_attention_layernorm.weight") ||
      refit_ref_is(rest, "self_attn.q_norm.weight") ||
      refit_ref_is(rest, "self_attn.k_norm.weight")) {
    REFIT_SRC("%s", rest);
    *src_row = 0;
    return REFIT_OK;
  }
  if (refit_ref_is(rest, "self_attn.qkv_proj.weight") ||
      refit_ref_is(rest, "self_attn.qkv_proj.bias")) {
    /* [q_t; k_t; v_t]; with tp > KV each KV head is shared by tp/KV ranks.
     * The bias (Qwen2) is loaded by the same weight_loader along the same
     * output dimension (vllm linear.py QKVParallelLinear), a row of the
     * matrix view being one element of it. */
    const char *kind = refit_ref_is(rest, "self_attn.qkv_proj.bias") ? "bias" : "weight";
    const int64_t KV = m->num_kv_heads;
    const int64_t kv_rows = tp <= KV ? KV / tp * D : D;
    const int64_t kv_first = tp <= KV ? t * kv_rows : (t / (tp / KV)) * D;
    if (row < q_rows) {
      REFIT_SRC("self_attn.q_proj.%s", kind);
      *src_row = t * q_rows + row;
    } else if (row < q_rows + kv_rows) {
      REFIT_SRC("self_attn.k_proj.%s", kind);
      *src_row = kv_first + row - q_rows;
    } else {
      REFIT_SRC("self_attn.v_proj.%s", kind);
      *src_row = kv_first + row - q_rows - kv_rows;
    }
    return REFIT_OK;
  }
  /* DeepSeek's multi-head latent attention (vllm deepseek_v2.py
   * DeepseekV2MLAAttention, model-families.md 3.3). head_dim is the rope
   * dimension R there: q rows per head are [nope P; rope R], kv_b_proj's
   * [k_nope P; v Vd], kv_a_proj_with_mqa's [latent kv_r; k_rope R]. */
  const int mla = m->family == REFIT_FAMILY_DEEPSEEK_V3;
  if (mla && refit_ref_is(rest, "self_attn.fused_qkv_a_proj.weight")) {
    /* MergedColumnParallelLinear(disable_tp): every rank the whole
     * [q_a_proj; kv_a_proj_with_mqa]. */
    const int q = row < m->q_lora_rank;
    REFIT_SRC("self_attn.%s.weight", q ? "q_a_proj" : "kv_a_proj_with_mqa");
    *src_row = q ? row : row - m->q_lora_rank;
    return REFIT_OK;
  }
  if (mla && (refit_ref_is(rest, "self_attn.q_a_layernorm.weight") ||
              refit_ref_is(rest, "self_attn.kv_a_layernorm.weight") ||
              refit_ref_is(rest, "self_attn.kv_a_proj_with_mqa.weight"))) {
    REFIT_SRC("%s", rest);
    *src_row = row;
    return REFIT_OK;
  }
  if (mla && (refit_ref_is(rest, "self_attn.q_b_proj.weight") ||
              refit_ref_is(rest, "self_attn.q_proj.weight") ||
              refit_ref_is(rest, "self_attn.kv_b_proj.weight"))) {
    /* ColumnParallelLinear: rank t holds the t-th of tp equal row blocks,
     * whole heads. */
    const int kv = refit_ref_is(rest, "self_attn.kv_b_proj.weight");
    const int64_t per_head = m->qk_nope_head_dim + (kv ? m->v_head_dim : D);
    REFIT_SRC("%s", rest);
    *src_row = t * (m->num_attention_heads / tp) * per_head + row;
    return REFIT_OK;
  }
  if (refit_ref_is(rest, "self_attn.o_proj.weight")) {
    /* RowParallelLinear: the t-th column block of heads x (v_head_dim, or
     * head_dim without MLA). */
    REFIT_SRC("%s", "self_attn.o_proj.weight");
    *src_row = row;
    *col_offset = mla ? t * (m->num_attention_heads / tp) * m->v_head_dim : t * q_rows;
    return REFIT_OK;
  }
  /* A gated MLP: the dense one, or DeepseekV2MoE's shared experts (one MLP
   * of num_shared_experts * moe_intermediate_size rows, on the dense tp
   * group whatever the experts' ep). */
  const int shared = strncmp(rest, "mlp.shared_experts.", 19) == 0;
  const char *mlp = shared ? rest + 19 : rest + 4;
  const int64_t width =
      shared ? m->num_shared_experts * m->moe_intermediate_size : m->intermediate_size;
  if ((shared || strncmp(rest, "mlp.", 4) == 0) &&
      refit_ref_is(mlp, "gate_up_proj.weight")) {
    const int64_t f = width / tp;
    REFIT_SRC("%s%s", shared ? "mlp.shared_experts." : "mlp.",
              row < f ? "gate_proj.weight" : "up_proj.weight");
    *src_row = t * f + (row < f ? row : row - f);
    return REFIT_OK;
  }
  if ((shared || strncmp(rest, "mlp.", 4) == 0) &&
      refit_ref_is(mlp, "down_proj.weight")) {
    REFIT_SRC("%s", rest);
    *src_row = row;
    *col_offset = t * (width / tp);
    return REFIT_OK;
  }
  if (refit_ref_is(rest, "mlp.gate.e_score_correction_bias")) {
    /* DeepseekV2MoE: FP32 [X], replicated, copied as loaded. */
    REFIT_SRC("%s", rest);
    *src_row = 0;
    return REFIT_OK;
  }
  if (refit_ref_is(rest, "mlp.gate.weight")) {
    REFIT_SRC("%s", "mlp.gate.weight");
    *src_row = row;
    return REFIT_OK;
  }
  if (refit_ref_is(rest, "mlp.experts.w13_weight") ||
      refit_ref_is(rest, "mlp.experts.w2_weight")) {
    /* ep 1: all experts, intermediate split over tp. ep tp: X/tp whole
     * experts per rank, contiguous. */
    const int64_t I = m->moe_intermediate_size;
    const int64_t i = gen->ep == 1 ? I / tp : I;
    const int64_t i_first = gen->ep == 1 ? t * i : 0;
    const int64_t e_first = gen->ep == 1 ? 0 : t * (m->num_experts / tp);
    if (refit_ref_is(rest, "mlp.experts.w13_weight")) {
      const int64_t e = e_first + row / (2 * i), r = row % (2 * i);
      REFIT_SRC("mlp.experts.%lld.%s", (long long)e,
                r < i ? "gate_proj.weight" : "up_proj.weight");
      *src_row = i_first + (r < i ? r : r - i);
    } else {
      const int64_t e = e_first + row / H;
      REFIT_SRC("mlp.experts.%lld.down_proj.weight", (long long)e);
      *src_row = row % H;
      *col_offset = i_first;
    }
    return REFIT_OK;
  }
#undef REFIT_SRC
unknown:
  return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                   "reference: no rule for runtime tensor '%s'", name);
}

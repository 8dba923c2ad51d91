/*
 * vLLM's runtime tensors of a layer (catalog_internal.h): fused qkv_proj
 * (or MLA's fused_qkv_a_proj and up projections) and gate_up_proj, the
 * experts' w13 and w2 stacks, the shared experts, each as segments of
 * Hugging Face tensors.
 */
#include "reshard/catalog_internal.h"
#include "reshard/family.h"

#define REFIT_GEN(layer_name, role, kind, nd, d0, d1, d2)                                \
  do {                                                                                   \
    refit_name_fmt(name, "model.layers.%d.%s", l, layer_name);                           \
    REFIT_CHECK(refit_add_gen(b, &g, l, role, kind, nd, d0, d1, d2, name));              \
  } while (0)

/*
 * Multi-latent attention of tp rank t (vLLM deepseek_v2.py
 * DeepseekV2MLAAttention; model-families.md 3.3): fused_qkv_a_proj =
 * [q_a_proj; kv_a_proj_with_mqa] replicated (MergedColumnParallelLinear with
 * disable_tp), or without q LoRA q_proj split by rows and
 * kv_a_proj_with_mqa replicated; q_b_proj and kv_b_proj split by rows
 * (whole heads), o_proj by columns; the two LayerNorms replicated. Every
 * linear is a LinearBase that MXFP8 quantizes (section 3.5).
 */
static refit_status_t refit_build_gen_mla(refit_catalog_builder_t *b, int l, int t,
                                          const refit_layer_src_t *ls) {
  const refit_model_t *m = &b->cat->model;
  const int gtp = b->cat->generator.tp;
  const int64_t H = m->hidden_size, R = m->head_dim, N = m->num_attention_heads;
  const int64_t qr = m->q_lora_rank, kvr = m->kv_lora_rank;
  const int64_t q_rows = N / gtp * (m->qk_nope_head_dim + R);
  const int64_t kvb_rows = N / gtp * (m->qk_nope_head_dim + m->v_head_dim);
  const int64_t o_cols = N / gtp * m->v_head_dim;
  char name[REFIT_NAME_MAX];
  refit_gen_tensor_t *g;

  if (qr > 0) {
    REFIT_GEN("self_attn.fused_qkv_a_proj.weight", REFIT_ROLE_LINEAR, REFIT_GEN_LINEAR, 2,
              qr + kvr + R, H, 0);
    g->k_field = REFIT_FIELD_MODEL_HIDDEN_SIZE;
    REFIT_CHECK(refit_add_seg(b, g, ls->q_a, 0, 0, qr, H, 0, 0));
    REFIT_CHECK(refit_add_seg(b, g, ls->kv_a, 0, 0, kvr + R, H, qr, 0));
    REFIT_GEN("self_attn.q_a_layernorm.weight", REFIT_ROLE_NORM, REFIT_GEN_PLAIN, 1, qr,
              0, 0);
    REFIT_CHECK(refit_add_seg(b, g, ls->q_a_norm, 0, 0, 1, qr, 0, 0));
    REFIT_GEN("self_attn.q_b_proj.weight", REFIT_ROLE_LINEAR, REFIT_GEN_LINEAR, 2, q_rows,
              qr, 0);
    g->k_field = REFIT_FIELD_MODEL_Q_LORA_RANK;
    REFIT_CHECK(refit_add_seg(b, g, ls->q_b, t * q_rows, 0, q_rows, qr, 0, 0));
  } else {
    REFIT_GEN("self_attn.q_proj.weight", REFIT_ROLE_LINEAR, REFIT_GEN_LINEAR, 2, q_rows,
              H, 0);
    g->k_field = REFIT_FIELD_MODEL_HIDDEN_SIZE;
    REFIT_CHECK(refit_add_seg(b, g, ls->q, t * q_rows, 0, q_rows, H, 0, 0));
    REFIT_GEN("self_attn.kv_a_proj_with_mqa.weight", REFIT_ROLE_LINEAR, REFIT_GEN_LINEAR,
              2, kvr + R, H, 0);
    g->k_field = REFIT_FIELD_MODEL_HIDDEN_SIZE;
    REFIT_CHECK(refit_add_seg(b, g, ls->kv_a, 0, 0, kvr + R, H, 0, 0));
  }
  REFIT_GEN("self_attn.kv_a_layernorm.weight", REFIT_ROLE_NORM, REFIT_GEN_PLAIN, 1, kvr,
            0, 0);
  REFIT_CHECK(refit_add_seg(b, g, ls->kv_a_norm, 0, 0, 1, kvr, 0, 0));
  /* W_UK_T and W_UV, which MLAAttention derives from kv_b_proj after
   * loading, are strided views of this tensor's storage when it stays BF16
   * (model-families.md 3.4): writing it in place updates them. A quantized
   * kv_b_proj gets a separate dequantized copy: refit rewrites it under
   * block FP8 (the loader's "_dequant" store), and the config refuses the
   * other precisions (config_rules.c). */
  REFIT_GEN("self_attn.kv_b_proj.weight", REFIT_ROLE_LINEAR, REFIT_GEN_LINEAR, 2,
            kvb_rows, kvr, 0);
  g->k_field = REFIT_FIELD_MODEL_KV_LORA_RANK;
  g->mla_derived = 1;
  REFIT_CHECK(refit_add_seg(b, g, ls->kv_b, t * kvb_rows, 0, kvb_rows, kvr, 0, 0));
  REFIT_GEN("self_attn.o_proj.weight", REFIT_ROLE_LINEAR, REFIT_GEN_LINEAR, 2, H, o_cols,
            0);
  g->k_field = REFIT_FIELD_MODEL_V_HEAD_DIM;
  return refit_add_seg(b, g, ls->o, 0, t * o_cols, H, o_cols, 0, 0);
}

/* A gated MLP of width f split over the generator's tp ranks: gate_up_proj
 * = [gate_t; up_t], down_proj by columns (vLLM MergedColumnParallelLinear,
 * RowParallelLinear). `module` is "mlp" or "mlp.shared_experts"; K of
 * down_proj is made of `k_field`. */
static refit_status_t refit_build_gen_mlp(refit_catalog_builder_t *b, int l, int t,
                                          const char *module, int32_t gate, int32_t up,
                                          int32_t down, int64_t width,
                                          refit_field_t k_field) {
  const int64_t H = b->cat->model.hidden_size, f = width / b->cat->generator.tp;
  char name[REFIT_NAME_MAX], tensor[REFIT_NAME_MAX];
  refit_gen_tensor_t *g;

  refit_name_fmt(tensor, "%s.gate_up_proj.weight", module);
  REFIT_GEN(tensor, REFIT_ROLE_LINEAR, REFIT_GEN_LINEAR, 2, 2 * f, H, 0);
  g->k_field = REFIT_FIELD_MODEL_HIDDEN_SIZE;
  REFIT_CHECK(refit_add_seg(b, g, gate, t * f, 0, f, H, 0, 0));
  REFIT_CHECK(refit_add_seg(b, g, up, t * f, 0, f, H, f, 0));
  refit_name_fmt(tensor, "%s.down_proj.weight", module);
  REFIT_GEN(tensor, REFIT_ROLE_LINEAR, REFIT_GEN_LINEAR, 2, H, f, 0);
  g->k_field = k_field;
  return refit_add_seg(b, g, down, 0, t * f, H, f, 0, 0);
}

/*
 * GQA attention of tp rank t (vLLM): qkv_proj = [q_t; k_t; v_t] with
 * KV-head replication when tp > KV (and its bias), o_proj split on dim 1,
 * the q/k norms replicated.
 */
static refit_status_t refit_build_gen_gqa(refit_catalog_builder_t *b, int l, int t,
                                          const refit_layer_src_t *ls) {
  const refit_model_t *m = &b->cat->model;
  const refit_family_desc_t *fam = refit_family_desc(m->family);
  const int gtp = b->cat->generator.tp;
  const int64_t H = m->hidden_size, D = m->head_dim;
  const int64_t q_rows = m->num_attention_heads / gtp * D;
  int64_t kv_rows, kv_row0;
  char name[REFIT_NAME_MAX];
  refit_gen_tensor_t *g;

  if (gtp <= m->num_kv_heads) {
    kv_rows = m->num_kv_heads / gtp * D;
    kv_row0 = t * kv_rows;
  } else {
    int64_t share = gtp / m->num_kv_heads; /* ranks sharing one KV head */
    kv_rows = D;
    kv_row0 = (t / share) * D;
  }

  REFIT_GEN("self_attn.qkv_proj.weight", REFIT_ROLE_LINEAR, REFIT_GEN_LINEAR, 2,
            q_rows + 2 * kv_rows, H, 0);
  g->k_field = REFIT_FIELD_MODEL_HIDDEN_SIZE;
  REFIT_CHECK(refit_add_seg(b, g, ls->q, t * q_rows, 0, q_rows, H, 0, 0));
  REFIT_CHECK(refit_add_seg(b, g, ls->k, kv_row0, 0, kv_rows, H, q_rows, 0));
  REFIT_CHECK(refit_add_seg(b, g, ls->v, kv_row0, 0, kv_rows, H, q_rows + kv_rows, 0));
  if (fam->qkv_bias) {
    /* QKVParallelLinear's bias (vllm qwen2.py Qwen2Attention, bias=True):
     * the weight's weight_loader with output_dim 0, so [q_t; k_t; v_t] of
     * the three biases, sharded and replicated as the weight's rows. BF16
     * under every quantization (a bias is no quantized weight). */
    refit_name_fmt(name, "model.layers.%d.self_attn.qkv_proj.bias", l);
    REFIT_CHECK(refit_add_gen_bias(b, &g, l, q_rows + 2 * kv_rows, name));
    REFIT_CHECK(refit_add_seg(b, g, ls->q_bias, t * q_rows, 0, q_rows, 1, 0, 0));
    REFIT_CHECK(refit_add_seg(b, g, ls->k_bias, kv_row0, 0, kv_rows, 1, q_rows, 0));
    REFIT_CHECK(
        refit_add_seg(b, g, ls->v_bias, kv_row0, 0, kv_rows, 1, q_rows + kv_rows, 0));
  }

  REFIT_GEN("self_attn.o_proj.weight", REFIT_ROLE_LINEAR, REFIT_GEN_LINEAR, 2, H, q_rows,
            0);
  g->k_field = REFIT_FIELD_MODEL_HEAD_DIM;
  REFIT_CHECK(refit_add_seg(b, g, ls->o, 0, t * q_rows, H, q_rows, 0, 0));

  if (fam->qk_norm) {
    REFIT_GEN("self_attn.q_norm.weight", REFIT_ROLE_NORM, REFIT_GEN_PLAIN, 1, D, 0, 0);
    REFIT_CHECK(refit_add_seg(b, g, ls->q_norm, 0, 0, 1, D, 0, 0));
    REFIT_GEN("self_attn.k_norm.weight", REFIT_ROLE_NORM, REFIT_GEN_PLAIN, 1, D, 0, 0);
    REFIT_CHECK(refit_add_seg(b, g, ls->k_norm, 0, 0, 1, D, 0, 0));
  }
  return REFIT_OK;
}

/*
 * Generator tensors of one layer for tp rank t (vLLM): the input norm, the
 * attention (GQA or MLA, above), the post-attention norm, then a dense MLP
 * (gate_up_proj = [gate_t; up_t], down_proj on dim 1) or the router, the
 * experts (w13 = [gate; up] per expert and w2, TP-sharded with ep 1 or
 * split over the ranks with ep tp) and the shared experts.
 */
refit_status_t refit_build_gen_layer(refit_catalog_builder_t *b, int l, int t,
                                     const refit_layer_src_t *ls) {
  const refit_model_t *m = &b->cat->model;
  const int gtp = b->cat->generator.tp;
  const int64_t H = m->hidden_size;
  char name[REFIT_NAME_MAX];
  refit_gen_tensor_t *g;

  REFIT_GEN("input_layernorm.weight", REFIT_ROLE_NORM, REFIT_GEN_PLAIN, 1, H, 0, 0);
  REFIT_CHECK(refit_add_seg(b, g, ls->in_norm, 0, 0, 1, H, 0, 0));
  if (refit_family_desc(m->family)->mla)
    REFIT_CHECK(refit_build_gen_mla(b, l, t, ls));
  else
    REFIT_CHECK(refit_build_gen_gqa(b, l, t, ls));

  REFIT_GEN("post_attention_layernorm.weight", REFIT_ROLE_NORM, REFIT_GEN_PLAIN, 1, H, 0,
            0);
  REFIT_CHECK(refit_add_seg(b, g, ls->post_norm, 0, 0, 1, H, 0, 0));

  if (!ls->moe)
    return refit_build_gen_mlp(b, l, t, "mlp", ls->gate, ls->up, ls->down,
                               m->intermediate_size, REFIT_FIELD_MODEL_INTERMEDIATE_SIZE);

  const int64_t X = m->num_experts, I = m->moe_intermediate_size;
  const int ep = b->cat->generator.ep;
  const int64_t E = ep == 1 ? X : X / gtp; /* local experts */
  const int64_t i = ep == 1 ? I / gtp : I; /* intermediate rows per rank */
  const int64_t e0 = ep == 1 ? 0 : t * E;  /* first global expert */
  const int64_t i0 = ep == 1 ? t * i : 0;  /* first intermediate row */

  /* vLLM builds the router as ReplicatedLinear with quant_config=None
   * (model_executor/models/qwen3_moe.py, Qwen3MoeSparseMoeBlock; deepseek_v2.py
   * GateLinear): BF16 under every quantization. */
  REFIT_GEN("mlp.gate.weight", REFIT_ROLE_ROUTER, REFIT_GEN_PLAIN, 2, X, H, 0);
  REFIT_CHECK(refit_add_seg(b, g, ls->router, 0, 0, X, H, 0, 0));
  if (ls->expert_bias >= 0) {
    /* DeepseekV2MoE: nn.Parameter(torch.empty(X, dtype=float32)), loaded by
     * a copy, replicated; FP32 [X] as [1, 2X] in 2-byte units. */
    REFIT_GEN("mlp.gate.e_score_correction_bias", REFIT_ROLE_F32, REFIT_GEN_PLAIN, 1, X,
              0, 0);
    g->rows = 1;
    g->cols = 2 * X;
    REFIT_CHECK(refit_add_seg(b, g, ls->expert_bias, 0, 0, 1, 2 * X, 0, 0));
  }
  REFIT_GEN("mlp.experts.w13_weight", REFIT_ROLE_EXPERT, REFIT_GEN_MOE_W13, 3, E, 2 * i,
            H);
  g->k_field = REFIT_FIELD_MODEL_HIDDEN_SIZE;
  for (int64_t e = 0; e < E; e++) {
    int32_t gate = ls->expert0 + (int32_t)(3 * (e0 + e));
    REFIT_CHECK(refit_add_seg(b, g, gate, i0, 0, i, H, e * 2 * i, 0));
    REFIT_CHECK(refit_add_seg(b, g, gate + 1, i0, 0, i, H, e * 2 * i + i, 0));
  }
  REFIT_GEN("mlp.experts.w2_weight", REFIT_ROLE_EXPERT, REFIT_GEN_MOE_W2, 3, E, H, i);
  g->k_field = REFIT_FIELD_MODEL_MOE_INTERMEDIATE_SIZE;
  for (int64_t e = 0; e < E; e++) {
    int32_t down = ls->expert0 + (int32_t)(3 * (e0 + e)) + 2;
    REFIT_CHECK(refit_add_seg(b, g, down, 0, i0, H, i, e * H, 0));
  }
  /* DeepseekV2MoE's shared_experts: a DeepseekV2MLP on the dense tp group,
   * tp-split even when the routed experts are expert-parallel. */
  if (ls->shared_gate >= 0)
    REFIT_CHECK(refit_build_gen_mlp(
        b, l, t, "mlp.shared_experts", ls->shared_gate, ls->shared_up, ls->shared_down,
        m->num_shared_experts * I, REFIT_FIELD_MODEL_NUM_SHARED_EXPERTS));
  return REFIT_OK;
}
#undef REFIT_GEN

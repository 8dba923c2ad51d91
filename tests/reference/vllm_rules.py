"""What a vLLM generator rank holds after a refit: an independent statement.

This module computes, from the full Hugging Face-named weights of a Qwen3,
Qwen3-MoE, Llama, Qwen2 or DeepSeek-V3 model and a refit job config, the runtime tensors of one generator
tensor-parallel rank exactly as vLLM holds them after
process_weights_after_loading: names, shapes, element types and bytes. It is
written from the rules in ../shared/reference/*.md and from the public
sources of vLLM and FlashInfer cited next to each rule, and shares no code
with refit's C kernels or planner, so that a byte-for-byte agreement between
the two is evidence and not an echo.

Sources (read with the project's search tools, 2026-08 snapshots):
  vLLM    vllm/model_executor/models/qwen3_moe.py (Qwen3MoeSparseMoeBlock,
          Qwen3MoeForCausalLM), qwen2.py (Qwen2Attention: QKVParallelLinear
          with bias=True, o_proj and the MLP without; no q/k norm;
          Qwen2ForCausalLM ties lm_head to embed_tokens), llama.py
          (LlamaAttention: no q/k norm, no bias for Llama 3.x), deepseek_v2.py
          (DeepseekV2MLAAttention, DeepseekV2MoE with shared_experts,
          DeepseekV2DecoderLayer; layers/attention/mla_attention.py for
          W_UK_T / W_UV), vllm/model_executor/layers/linear.py
          (QKVParallelLinear / MergedColumnParallelLinear / RowParallelLinear
          weight_loader), vllm/model_executor/layers/vocab_parallel_embedding.py
          (pad_vocab_size, VocabParallelEmbedding._get_indices, weight_loader),
          vllm/model_executor/layers/fused_moe/layer.py (FusedMoE _load_w13,
          _load_w2, determine_expert_map), vllm/model_executor/layers/
          quantization/mxfp8.py (Mxfp8Config.get_quant_method,
          Mxfp8OnlineLinearMethod, Mxfp8OnlineMoEMethod),
          .../quantization/utils/mxfp8_utils.py (swizzle_mxfp8_scale),
          .../quantization/utils/flashinfer_utils.py (swap_w13_to_w31,
          prepare_fp8_moe_layer_for_fi, _shuffle_mxfp8_moe_weights).
  FlashInfer (fb28d72) csrc/nv_internal/tensorrt_llm/kernels/
          quantization_utils.cuh (cvt_warp_fp16_to_mxfp8,
          get_sf_out_offset_128x4), csrc/nv_internal/cpp/kernels/
          quantization.cu (block_scale_interleave_kernel), flashinfer/utils.py
          (srcToDstBlk32RowMap, get_shuffle_matrix_a_row_indices),
          flashinfer/fused_moe/core.py
          (get_reorder_rows_for_gated_act_gemm_row_indices,
          _maybe_get_cached_w3_w1_permute_indices),
          flashinfer/quantization/fp4_quantization.py (shuffle_matrix_a,
          shuffle_matrix_sf_a), flashinfer/gemm/gemm_base.py (mm_mxfp8),
          tests/gemm/test_mm_mxfp8.py (the trtllm weight preparation).

Store naming (which stores exist beside a weight, their shapes when the
scale bytes are padded, the [K, N] view of the CuTe-DSL backend) follows
refit's dump schema (runtime/src/session/dump.h); only names and shapes are taken
from there, never a byte value.

Weights are numpy uint16 arrays of bfloat16 bit patterns (float32 arrays for
the one float32 tensor, DeepSeek's e_score_correction_bias); results are
numpy arrays of the stored bytes: uint16 for bfloat16, uint8 for
float8_e4m3fn and for E8M0 scales, float32 for float32.
"""

import collections

import numpy as np

# vocab_parallel_embedding.py: DEFAULT_VOCAB_PADDING_SIZE.
VOCAB_PADDING = 64
# mxfp8_utils.py: MXFP8_BLOCK_SIZE, one E8M0 scale per 32 elements along K.
MXFP8_BLOCK = 32
# flashinfer_utils.py _shuffle_mxfp8_moe_weights and test_mm_mxfp8.py use an
# epilogue tile of 128 rows, which selects FlashInfer's 32-row shuffle blocks
# (flashinfer/utils.py get_shuffle_block_size).
SHUFFLE_BLOCK = 32
# The 128x4 scale layout works on tiles of 128 rows by 4 scale columns
# (quantization_utils.cuh get_sf_out_offset_128x4).
SF_TILE_ROWS = 128
SF_TILE_COLS = 4
E4M3_MAX = 448.0

# Defaults of refit's config table (runtime/src/config/config_table.h) for the keys
# this module reads; a config dict from PyYAML may leave any of them out.
_DEFAULTS = {
    "model": {"intermediate_size": 0, "num_experts": 0,
              "moe_intermediate_size": 0, "tie_word_embeddings": False,
              "q_lora_rank": 0, "kv_lora_rank": 0, "qk_nope_head_dim": 0,
              "v_head_dim": 0, "num_shared_experts": 0,
              "first_k_dense_replace": 0, "moe_layer_freq": 0,
              "expert_bias": False},
    "generator": {"tp": 1, "ep": 1, "engines": 1},
    "refit": {"precision": "bf16", "linear_backend": "flashinfer_cutlass",
              "moe_backend": "flashinfer_trtllm",
              "quantization_ignore": ["lm_head"]},
}

_LINEAR_BACKENDS = ("flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_trtllm")
# FlashInfer's fused-MoE backends vLLM's ModelOptNvFp4FusedMoE can use
# (oracle/nvfp4.py NvFp4MoeBackend FLASHINFER_TRTLLM, FLASHINFER_CUTLASS).
_MOE_BACKENDS = ("flashinfer_trtllm", "flashinfer_cutlass")

# Which tensors each family's attention has beyond q/k/v/o (vLLM qwen3.py,
# qwen3_moe.py, llama.py, qwen2.py).
_FAMILIES = {
    "qwen3": {"qk_norm": True, "qkv_bias": False},
    "qwen3_moe": {"qk_norm": True, "qkv_bias": False},
    "llama": {"qk_norm": False, "qkv_bias": False},
    "qwen2": {"qk_norm": False, "qkv_bias": True},
    # deepseek_v2.py DeepseekV2MLAAttention: no q/k/v, see _mla.
    "deepseek_v3": {"qk_norm": False, "qkv_bias": False},
}


class Job:
    """The parts of a refit config that decide what a generator rank holds."""

    def __init__(self, cfg):
        def section(name):
            merged = dict(_DEFAULTS.get(name, {}))
            merged.update(cfg.get(name) or {})
            return merged

        model, gen, refit = section("model"), section("generator"), section("refit")
        self.family = model["family"]
        if self.family not in _FAMILIES:
            raise ValueError(f"model.family {self.family!r}: expected one of {sorted(_FAMILIES)}")
        self.hidden = int(model["hidden_size"])
        self.layers = int(model["num_layers"])
        self.heads = int(model["num_attention_heads"])
        self.kv_heads = int(model["num_kv_heads"])
        self.head_dim = int(model["head_dim"])
        self.vocab = int(model["vocab_size"])
        self.ffn = int(model["intermediate_size"])
        self.experts = int(model["num_experts"])
        self.moe_ffn = int(model["moe_intermediate_size"])
        self.tied = bool(model["tie_word_embeddings"])
        # DeepSeek (model-families.md section 6): head_dim is the rope
        # dimension qk_rope_head_dim.
        self.q_lora = int(model["q_lora_rank"])
        self.kv_lora = int(model["kv_lora_rank"])
        self.nope = int(model["qk_nope_head_dim"])
        self.v_dim = int(model["v_head_dim"])
        self.shared = int(model["num_shared_experts"])
        self.first_dense = int(model["first_k_dense_replace"])
        self.moe_freq = int(model["moe_layer_freq"]) or 1
        self.expert_bias = self.mla and bool(model["expert_bias"])
        self.tp = int(gen["tp"])
        self.ep = int(gen["ep"])
        self.precision = refit["precision"]
        self.fp8_scale = refit.get("fp8_scale", "fp32")
        self.linear_backend = refit["linear_backend"]
        self.moe_backend = refit["moe_backend"]
        self.ignore = list(refit["quantization_ignore"] or [])
        self._validate()

    @property
    def mla(self):
        return self.family == "deepseek_v3"

    def moe_layer(self, i):
        """Qwen3MoeSparseMoeBlock in every layer; DeepseekV2DecoderLayer:
        routed experts iff n_routed_experts, i >= first_k_dense_replace and
        i % moe_layer_freq == 0."""
        if self.family == "qwen3_moe":
            return True
        return self.mla and i >= self.first_dense and i % self.moe_freq == 0

    @property
    def moe(self):
        return any(self.moe_layer(i) for i in range(self.layers))

    @property
    def qk_norm(self):
        """Qwen3's per-head RMSNorms of q and k (Qwen3Attention q_norm,
        k_norm); Llama and Qwen2 have none."""
        return _FAMILIES[self.family]["qk_norm"]

    @property
    def qkv_bias(self):
        """Qwen2's biases of q_proj, k_proj and v_proj."""
        return _FAMILIES[self.family]["qkv_bias"]

    @property
    def mxfp8(self):
        return self.precision == "mxfp8"

    @property
    def fp8_block(self):
        return self.precision == "fp8_block"

    @property
    def nvfp4(self):
        return self.precision == "nvfp4"

    def _validate(self):
        tp = self.tp
        # qwen3_moe.py Qwen3MoeAttention: heads split evenly; KV heads either
        # split evenly or replicated over tp / KV ranks each.
        if self.heads % tp:
            raise ValueError(f"num_attention_heads {self.heads} not divisible by tp {tp}")
        if (self.kv_heads >= tp and self.kv_heads % tp) or (self.kv_heads < tp and tp % self.kv_heads):
            raise ValueError(f"num_kv_heads {self.kv_heads} and tp {tp}: one must divide the other")
        # vocab_parallel_embedding.py: divide(num_embeddings_padded, tp_size).
        if padded_vocab(self.vocab) % tp:
            raise ValueError(f"padded vocabulary {padded_vocab(self.vocab)} not divisible by tp {tp}")
        if self.ep not in (1, tp):
            raise ValueError(f"generator.ep {self.ep}: expected 1 or tp ({tp})")
        if self.moe:
            if self.ep == 1 and self.moe_ffn % tp:
                raise ValueError(f"moe_intermediate_size {self.moe_ffn} not divisible by tp {tp}")
            if self.ep == tp and self.experts % tp:
                raise ValueError(f"num_experts {self.experts} not divisible by ep {tp}")
        if any(not self.moe_layer(i) for i in range(self.layers)) and self.ffn % tp:
            raise ValueError(f"intermediate_size {self.ffn} not divisible by tp {tp}")
        if self.mla and (self.shared * self.moe_ffn) % tp:
            raise ValueError(f"shared experts' width {self.shared * self.moe_ffn} not divisible by tp {tp}")
        if self.precision not in ("bf16", "mxfp8", "fp8_block", "nvfp4"):
            raise ValueError(f"refit.precision {self.precision!r}: expected bf16, mxfp8, "
                             f"fp8_block or nvfp4")
        if self.nvfp4 and self.family not in ("qwen3", "llama", "qwen3_moe"):
            # The dense families' NVFP4 linears and qwen3_moe's experts
            # (_nvfp4_experts) are stated here, as refit's config accepts.
            raise ValueError(f"refit.precision nvfp4 for model.family {self.family!r}: "
                             f"only qwen3, llama and qwen3_moe are stated")
        if self.fp8_scale not in ("fp32", "pow2"):
            raise ValueError(f"refit.fp8_scale {self.fp8_scale!r}: expected fp32 or pow2")
        if self.linear_backend not in _LINEAR_BACKENDS:
            raise ValueError(f"refit.linear_backend {self.linear_backend!r}")
        if self.moe_backend not in _MOE_BACKENDS:
            raise ValueError(f"refit.moe_backend {self.moe_backend!r}: expected one of "
                             f"{_MOE_BACKENDS}")
        if self.mxfp8 and self.moe and self.moe_backend != "flashinfer_trtllm":
            raise ValueError(f"refit.moe_backend {self.moe_backend!r}: MXFP8 experts are "
                             f"stated for flashinfer_trtllm only")


def _job(cfg):
    return cfg if isinstance(cfg, Job) else Job(cfg)


def _round_up(n, m):
    return -(-n // m) * m


def padded_vocab(vocab):
    """vocab_parallel_embedding.py pad_vocab_size: round up to a multiple of 64."""
    return _round_up(vocab, VOCAB_PADDING)


def _layer(i, rest):
    return f"model.layers.{i}.{rest}"


# DeepSeek's router score-correction bias (topk_method noaux_tc): float32
# [E] in the checkpoint, in vLLM (DeepseekV2MoE: nn.Parameter of dtype
# float32, loaded by a copy) and in Megatron (TopKRouter.expert_bias, an FP32
# buffer). Every other tensor is bfloat16.
EXPERT_BIAS = "mlp.gate.e_score_correction_bias"


def is_float32(name):
    """Is Hugging Face (or vLLM) tensor `name` float32 (EXPERT_BIAS)?"""
    return name.endswith("." + EXPERT_BIAS)


def hf_tensor_shapes(cfg):
    """Every Hugging Face tensor of the model with its full shape (sharding.md)."""
    job = _job(cfg)
    h, d = job.hidden, job.head_dim
    shapes = collections.OrderedDict()
    shapes["model.embed_tokens.weight"] = (job.vocab, h)
    for i in range(job.layers):
        attn = {"q_proj": (job.heads * d, h), "k_proj": (job.kv_heads * d, h),
                "v_proj": (job.kv_heads * d, h), "o_proj": (h, job.heads * d)}
        if job.mla:
            attn = _mla_hf_shapes(job)
        if job.qk_norm:
            attn.update({"q_norm": (d,), "k_norm": (d,)})
        for name, shape in attn.items():
            shapes[_layer(i, f"self_attn.{name}.weight")] = shape
        if job.qkv_bias:
            # Qwen2: q_proj.bias [nq d], k_proj.bias and v_proj.bias [nkv d].
            for name, n in (("q_proj", job.heads), ("k_proj", job.kv_heads),
                            ("v_proj", job.kv_heads)):
                shapes[_layer(i, f"self_attn.{name}.bias")] = (n * d,)
        shapes[_layer(i, "input_layernorm.weight")] = (h,)
        shapes[_layer(i, "post_attention_layernorm.weight")] = (h,)
        if job.moe_layer(i):
            shapes[_layer(i, "mlp.gate.weight")] = (job.experts, h)
            if job.expert_bias:
                shapes[_layer(i, EXPERT_BIAS)] = (job.experts,)
            for e in range(job.experts):
                expert = f"mlp.experts.{e}"
                shapes[_layer(i, f"{expert}.gate_proj.weight")] = (job.moe_ffn, h)
                shapes[_layer(i, f"{expert}.up_proj.weight")] = (job.moe_ffn, h)
                shapes[_layer(i, f"{expert}.down_proj.weight")] = (h, job.moe_ffn)
            if job.mla and job.shared:
                fs = job.shared * job.moe_ffn
                shapes[_layer(i, "mlp.shared_experts.gate_proj.weight")] = (fs, h)
                shapes[_layer(i, "mlp.shared_experts.up_proj.weight")] = (fs, h)
                shapes[_layer(i, "mlp.shared_experts.down_proj.weight")] = (h, fs)
        else:
            shapes[_layer(i, "mlp.gate_proj.weight")] = (job.ffn, h)
            shapes[_layer(i, "mlp.up_proj.weight")] = (job.ffn, h)
            shapes[_layer(i, "mlp.down_proj.weight")] = (h, job.ffn)
    shapes["model.norm.weight"] = (h,)
    if not job.tied:
        shapes["lm_head.weight"] = (job.vocab, h)
    return shapes


def _mla_hf_shapes(job):
    """DeepSeek's attention in the checkpoint (model-families.md 3.1): with q
    LoRA q_a_proj [q_r, H], q_a_layernorm [q_r], q_b_proj [N(P+R), q_r],
    else q_proj [N(P+R), H]; kv_a_proj_with_mqa [kv_r + R, H],
    kv_a_layernorm [kv_r], kv_b_proj [N(P+Vd), kv_r], o_proj [H, N Vd]."""
    h, n, r = job.hidden, job.heads, job.head_dim
    attn = {}
    if job.q_lora:
        attn["q_a_proj"] = (job.q_lora, h)
        attn["q_a_layernorm"] = (job.q_lora,)
        attn["q_b_proj"] = (n * (job.nope + r), job.q_lora)
    else:
        attn["q_proj"] = (n * (job.nope + r), h)
    attn["kv_a_proj_with_mqa"] = (job.kv_lora + r, h)
    attn["kv_a_layernorm"] = (job.kv_lora,)
    attn["kv_b_proj"] = (n * (job.nope + job.v_dim), job.kv_lora)
    attn["o_proj"] = (h, n * job.v_dim)
    return attn


# ---------------------------------------------------------------------------
# Which modules are MXFP8
# ---------------------------------------------------------------------------

# Qwen3MoeForCausalLM.packed_modules_mapping (and DeepseekV2ForCausalLM's,
# which adds fused_qkv_a_proj): the checkpoint modules that a fused vLLM
# module is made of.
_PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"),
           "gate_up_proj": ("gate_proj", "up_proj"),
           "fused_qkv_a_proj": ("q_a_proj", "kv_a_proj_with_mqa")}


def _matches(module, pattern):
    """True when the dotted segments of `pattern` occur, in order and
    contiguous, among those of `module` (refit's quantization_ignore rule:
    "whole dotted segments of the name", so mlp.gate never matches
    mlp.gate_up_proj)."""
    mod, pat = module.split("."), pattern.split(".")
    return any(mod[k:k + len(pat)] == pat for k in range(len(mod) - len(pat) + 1))


def _ignored(job, module):
    """quant_utils.py is_layer_skipped with a fused mapping: a fused module is
    skipped when its checkpoint shards are, and shards that disagree are an
    error, as in vLLM."""
    leaf = module.rsplit(".", 1)[-1]
    names = [module[: -len(leaf)] + shard for shard in _PACKED.get(leaf, ())] or [module]
    skipped = {any(_matches(n, p) for p in job.ignore) for n in names}
    if len(skipped) > 1:
        raise ValueError(f"quantization_ignore {job.ignore} skips only some shards of {module}")
    return skipped.pop() or any(_matches(module, p) for p in job.ignore)


def _quantized(job, module):
    """Mxfp8Config.get_quant_method (vllm/.../quantization/mxfp8.py) quantizes
    LinearBase and FusedMoE layers that are not skipped. The router is a
    ReplicatedLinear built with quant_config=None (qwen3_moe.py
    Qwen3MoeSparseMoeBlock), and VocabParallelEmbedding / ParallelLMHead are
    not LinearBase, so neither ever reaches that method: callers pass only the
    attention, dense-MLP and expert modules here."""
    return (job.mxfp8 or job.fp8_block or job.nvfp4) and not _ignored(job, module)


# ---------------------------------------------------------------------------
# Sharding (vLLM weight loaders)
# ---------------------------------------------------------------------------

def _rows(w, start, count):
    return w[start:start + count]


def _cols(w, start, count):
    return w[:, start:start + count]


def _qkv(job, w, i, t, kind="weight"):
    """QKVParallelLinear.weight_loader (linear.py): q shard t; k and v shard
    t // num_kv_head_replicas, where replicas = tp / KV when tp > KV. The
    bias (kind "bias", Qwen2) goes through the same loader along the same
    output dimension (output_dim 0), element for element as the weight's
    rows."""
    d = job.head_dim
    q_loc = job.heads // job.tp
    kv_loc = max(1, job.kv_heads // job.tp)
    replicas = max(1, job.tp // job.kv_heads)
    kv_shard = t // replicas
    q = _rows(w[_layer(i, f"self_attn.q_proj.{kind}")], t * q_loc * d, q_loc * d)
    k = _rows(w[_layer(i, f"self_attn.k_proj.{kind}")], kv_shard * kv_loc * d, kv_loc * d)
    v = _rows(w[_layer(i, f"self_attn.v_proj.{kind}")], kv_shard * kv_loc * d, kv_loc * d)
    return np.concatenate([q, k, v])


def _column_pair(job, gate, up, t, width):
    """MergedColumnParallelLinear.weight_loader (linear.py): rank t holds rows
    [t*width/tp, (t+1)*width/tp) of gate, then the same rows of up."""
    n = width // job.tp
    return np.concatenate([_rows(gate, t * n, n), _rows(up, t * n, n)])


def _vocab_shard(job, w, t):
    """VocabParallelEmbedding: the vocabulary is padded to a multiple of 64
    and split evenly; weight_loader copies the rank's real rows and fills the
    rest (rows >= V) with zeros."""
    per_rank = padded_vocab(job.vocab) // job.tp
    out = np.zeros((per_rank, job.hidden), dtype=np.uint16)
    start = t * per_rank
    real = max(0, min(per_rank, job.vocab - start))
    out[:real] = w[start:start + real]
    return out


def _expert_range(job, t):
    """FusedMoE determine_expert_map, linear placement: with ep == tp, rank t
    holds experts [t*E/tp, (t+1)*E/tp), whole; with ep == 1 every expert."""
    if job.ep == 1:
        return range(job.experts)
    n = job.experts // job.tp
    return range(t * n, (t + 1) * n)


def _experts(job, w, i, t):
    """FusedMoE._load_w13 / _load_w2: w13 [E_loc, 2I_loc, H] = [gate; up] per
    expert, w2 [E_loc, H, I_loc]; intermediate split over tp only when ep == 1."""
    shard_tp = job.tp if job.ep == 1 else 1
    shard_t = t if job.ep == 1 else 0
    n = job.moe_ffn // shard_tp
    w13, w2 = [], []
    for e in _expert_range(job, t):
        pre = f"mlp.experts.{e}"
        gate, up = w[_layer(i, f"{pre}.gate_proj.weight")], w[_layer(i, f"{pre}.up_proj.weight")]
        w13.append(np.concatenate([_rows(gate, shard_t * n, n), _rows(up, shard_t * n, n)]))
        w2.append(_cols(w[_layer(i, f"{pre}.down_proj.weight")], shard_t * n, n))
    return np.stack(w13), np.stack(w2)


# ---------------------------------------------------------------------------
# MXFP8 quantization (FlashInfer cvt_warp_fp16_to_mxfp8)
# ---------------------------------------------------------------------------

def bf16_to_float(bits):
    """bfloat16 bit patterns to float64 values (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _e8m0_round_up(t):
    """__nv_cvt_float_to_e8m0(t, __NV_SATFINITE, cudaRoundPosInf): the biased
    exponent of the smallest power of two >= t, at least 0 (2^-127) and at
    most 254 (satfinite; 255 is NaN). t is float32 and non-negative."""
    frac, exp = np.frexp(t.astype(np.float64))
    # t = frac * 2^exp with frac in [0.5, 1): a power of two exactly when
    # frac == 0.5, and then ceil(log2 t) = exp - 1.
    ceil_log2 = np.where(frac == 0.5, exp - 1, exp)
    return np.where(t == 0, 0, np.clip(ceil_log2 + 127, 0, 254)).astype(np.int64)


def _e4m3_encode(v):
    """float64 values to float8_e4m3fn bytes: round to nearest even, satfinite
    (cvt.rn.satfinite.e4m3x2.f32 after FlashInfer's clamp to +-448). E4M3fn:
    bias 7, 3 mantissa bits, subnormal step 2^-9, max 448 = 0x7E."""
    mag = np.abs(v)
    _, exp = np.frexp(mag)
    # Values below 2^-6 share the subnormal binade, whose quantum is 2^-9.
    binade = np.maximum(exp - 1, -6)
    quantum = np.ldexp(1.0, binade - 3)
    q = np.minimum(np.rint(mag / quantum) * quantum, E4M3_MAX)
    _, qexp = np.frexp(q)
    normal = q >= 2.0 ** -6
    field = np.where(normal, qexp - 1 + 7, 0)
    mant = np.where(normal, q / np.ldexp(1.0, qexp - 1) * 8 - 8, q / 2.0 ** -9)
    code = (field.astype(np.int64) << 3) | mant.astype(np.int64)
    return (code | (np.signbit(v).astype(np.int64) << 7)).astype(np.uint8)


# FlashInfer multiplies the block maximum by reciprocal_approximate_ftz(448),
# which is 1/448 correctly rounded to float32 (0x3b124925, as
# mxfp8-and-trtllm-layouts.md section 1 states).
_RCP_448 = np.float32(1.0) / np.float32(E4M3_MAX)


def mxfp8_quantize(bits):
    """BF16 [..., K] -> (E4M3 bytes [..., K], E8M0 scales [..., K/32]) in the
    linear scale layout.

    FlashInfer cvt_warp_fp16_to_mxfp8: amax over 32 elements of a row; the
    scale is amax * fp32(1/448) rounded up to a power of two (E8M0); elements
    are x / scale, clamped to +-448 and rounded to E4M3 (the division by a
    power of two is exact). mxfp8-and-trtllm-layouts.md section 1 adds two
    rules kept here: a block whose scale byte is 0 quantizes to zeros, and
    that scale byte is then written as 1 (the TRTLLM kernels reject 0).
    NaN and infinity are outside the bit-exact contract: refused."""
    k = bits.shape[-1]
    if k % MXFP8_BLOCK:
        raise ValueError(f"MXFP8 needs K % 32 == 0, got K = {k}")
    x = bf16_to_float(bits)
    if not np.isfinite(x).all():
        raise ValueError("MXFP8 reference: non-finite input is outside the bit-exact contract")
    blocks = x.reshape(bits.shape[:-1] + (k // MXFP8_BLOCK, MXFP8_BLOCK))
    amax = np.abs(blocks).max(axis=-1).astype(np.float32)
    scale = _e8m0_round_up(amax * _RCP_448)
    inverse = np.where(scale == 0, 0.0, np.ldexp(1.0, 127 - scale))
    values = _e4m3_encode(blocks * inverse[..., None]).reshape(bits.shape)
    return values, np.where(scale == 0, 1, scale).astype(np.uint8)


# ---------------------------------------------------------------------------
# Block FP8 (NeMo-RL cast_tensor_to_fp8_blockwise, model-families.md 4.2)
# ---------------------------------------------------------------------------

# fp8_utils.py / NeMo-RL FP8_BLOCK_QUANT_KWARGS: weight_block_size [128, 128].
FP8_BLOCK = 128


def _e4m3_from_float32(v):
    """torch's float32 -> float8_e4m3fn cast of values already clamped to
    +-448 (round to nearest even); NaN -> 0x7F whatever its sign (the GPU's
    0 * Inf is the positive canonical NaN)."""
    nan = np.isnan(v)
    codes = _e4m3_encode(np.where(nan, 0.0, v.astype(np.float64)))
    return np.where(nan, np.uint8(0x7F), codes).astype(np.uint8)


def fp8_block_scales(amax, pow2):
    """(scale, scale_inv), float32, of blocks whose amax (float32) is given:
    steps 3 and 4 of fp8_block_quantize."""
    one = np.float32(1.0)
    amax = np.asarray(amax, dtype=np.float32)
    with np.errstate(all="ignore"):
        nan = np.isnan(amax)
        if pow2:
            # ceil(log2(Inf)) = Inf, clamped to 127: E = 254.
            finite = np.where(nan | (amax == np.inf), np.float32(0), amax)
            e = np.where(amax == np.inf, 254, _e8m0_round_up(finite * _RCP_448))
            scale = np.where(e == 0, one, np.ldexp(one, 127 - e).astype(np.float32))
        else:
            scale = (one / amax) * np.float32(E4M3_MAX)
            scale = np.where((amax == 0) | (amax == np.inf), one, scale)
        scale = np.where(nan, np.float32(np.nan), scale).astype(np.float32)
        return scale, (one / scale).astype(np.float32)


def fp8_block_quantize(bits, pow2=False):
    """BF16 [M, K] -> (E4M3 bytes [M, K], float32 scale_inv [ceil(M/128),
    ceil(K/128)]), one HF tensor as NeMo-RL quantizes it before vLLM loads it.

    In float32, as torch computes it (model-families.md 4.2, confirmed in
    NeMo-RL's nemo_rl/models/generation/fp8.py):
      1. pad to multiples of 128 with the tensor's last element x[-1, -1];
      2. amax = max |x| per 128 x 128 block (the padding counts);
      3. fp32 scales: scale = reciprocal(amax) * 448 (torch's `448 / t`),
         1 where amax is 0 or Inf; scale_inv = reciprocal(scale);
      4. pow2 scales: E = clamp(ceil(log2(amax * fl(1/448))), -127, 127) + 127,
         scale = 2^(127 - E), 1 when E == 0; scale_inv = 1 / scale;
      5. q = e4m3(clamp(x * scale, -448, 448)), the padding cropped.
    A block with a NaN is refit's own rule (outside NeMo-RL's contract): every
    byte 0x7F and scale_inv NaN."""
    m, k = bits.shape
    x = (bits.astype(np.uint32) << 16).view(np.float32)
    pm, pk = _round_up(m, FP8_BLOCK), _round_up(k, FP8_BLOCK)
    padded = np.full((pm, pk), x[-1, -1], dtype=np.float32)
    padded[:m, :k] = x
    nbr, nbc = pm // FP8_BLOCK, pk // FP8_BLOCK
    blocks = padded.reshape(nbr, FP8_BLOCK, nbc, FP8_BLOCK).transpose(0, 2, 1, 3)
    blocks = blocks.reshape(nbr, nbc, FP8_BLOCK * FP8_BLOCK)
    with np.errstate(all="ignore"):
        amax = np.abs(blocks).max(axis=-1)  # NaN propagates
        scale, scale_inv = fp8_block_scales(amax, pow2)
        v = np.clip(blocks * scale[..., None], np.float32(-E4M3_MAX), np.float32(E4M3_MAX))
    q = _e4m3_from_float32(v.astype(np.float32))
    q = q.reshape(nbr, nbc, FP8_BLOCK, FP8_BLOCK).transpose(0, 2, 1, 3).reshape(pm, pk)
    return np.ascontiguousarray(q[:m, :k]), scale_inv


def e4m3_decode(codes):
    """float8_e4m3fn bytes to float32 values, from the format's definition:
    sign, 4 exponent bits of bias 7, 3 mantissa bits; exponent 0 is
    subnormal (m / 8 * 2^-6); S.1111.111 is NaN and there is no infinity."""
    c = codes.astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    e, m = (c >> 3) & 0xF, c & 7
    mag = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1.0 + m / 8.0) * 2.0 ** (e - 7))
    return np.where((c & 0x7F) == 0x7F, np.nan, sign * mag).astype(np.float32)


def _bf16_rne(values):
    """float32 -> bfloat16 bits, round to nearest even; NaN is 0x7FFF, what
    CUDA's __float2bfloat16 writes (vLLM dequantizes on the GPU)."""
    u = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FFF), r)


def fp8_block_dequantize(codes, scale_inv):
    """vLLM's scaled_dequantize(weight, weight_scale_inv, group_shape
    [128, 128], out_dtype=bfloat16) (model-families.md 3.4): each element's
    E4M3 value times its block's scale_inv, one float32 multiply, then
    rounded to bfloat16."""
    rows, cols = codes.shape
    per_elem = np.repeat(np.repeat(scale_inv, FP8_BLOCK, axis=0), FP8_BLOCK, axis=1)
    with np.errstate(all="ignore"):
        prod = e4m3_decode(codes) * per_elem[:rows, :cols].astype(np.float32)
    return _bf16_rne(prod.astype(np.float32))


# ---------------------------------------------------------------------------
# NVFP4 (docs/nvfp4.md): FlashInfer cvt_warp_fp16_to_fp4 with
# DISABLE_FP4_QUANT_FAST_MATH, the global scale as torch computes
# (448 * 6) / amax, vLLM's ModelOpt NVFP4 tensors
# ---------------------------------------------------------------------------

NVFP4_BLOCK = 16
# The E2M1 values of codes 0..7 (bit 3 is the sign).
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_F32 = np.float32
_FLT_MAX = np.finfo(np.float32).max


def _e2m1_encode(v):
    """float32 values to E2M1 codes (uint8, low nibble): the nearest of the
    eight magnitudes, a tie to the even code, beyond 6 (and +-Inf) 6; the
    sign bit of v is kept, also on zero; NaN is code 7 (refit's rule, the
    format has no NaN)."""
    mag = np.abs(v.astype(np.float64))
    nan = np.isnan(mag)
    # Saturate first: far beyond 6 every distance rounds to the same float.
    mag = np.where(nan, 6.0, np.minimum(mag, 6.0))
    dist = np.abs(mag[..., None] - E2M1_VALUES)
    best = dist.min(axis=-1, keepdims=True)
    # Among the nearest codes take the even one (two tie at most, and they
    # are neighbours, so exactly one is even).
    near = dist == best
    even = near & (np.arange(8) % 2 == 0)
    code = np.where(even.any(axis=-1), np.argmax(even, axis=-1), np.argmax(near, axis=-1))
    code = code | (np.signbit(v).astype(np.int64) << 3)
    return np.where(nan, 7, code).astype(np.uint8)


def _e4m3_value(code):
    """The exact value of a non-negative E4M3 byte below 0x7F."""
    code = code.astype(np.int64)
    e, m = code >> 3, code & 7
    return np.where(e == 0, m * 2.0 ** -9, (1.0 + m / 8.0) * np.exp2(e - 7.0))


def nvfp4_amax(bits):
    """The amax of a BF16 tensor as float32: NaN ignored, 0 when empty."""
    x = np.abs(bf16_to_float(np.asarray(bits)))
    x = x[~np.isnan(x)]
    return _F32(x.max()) if x.size else _F32(0.0)


def nvfp4_global_scale(amax):
    """(gsf, weight_scale_2) of a tensor whose whole amax is `amax`:
    gsf = (448 * 6) / amax as torch computes a scalar over a tensor
    (reciprocal, then multiply: Tensor.__rtruediv__), amax after
    nan_to_num (+Inf -> FLT_MAX); weight_scale_2 = 1 / gsf."""
    a = _F32(_FLT_MAX) if np.isinf(amax) else _F32(amax)
    with np.errstate(all="ignore"):
        gsf = (_F32(1.0) / a) * _F32(448.0 * 6.0)
        return _F32(gsf), _F32(_F32(1.0) / gsf)


def nvfp4_quantize(bits, gsf):
    """BF16 [M, K] -> (packed E2M1 uint8 [M, ceil(K/2)], E4M3 scales uint8
    [M, ceil(K/16)] linear) under global scale gsf (float32), in float32 as
    cvt_warp_fp16_to_fp4 computes with fast math off
    (quantization_utils.cuh):
      vmax  = max |x| over 16 elements of a row (a partial last block: its
              own elements; NaN ignored);
      sf    = e4m3_satfinite(vmax * (gsf * fl(1/6))), 0 when vmax == 0;
      out   = min(1 / (float(sf) * (1 / gsf)), FLT_MAX), 0 when vmax == 0;
      q     = e2m1(x * out), element 2i in the low nibble of byte i."""
    m, k = bits.shape
    kp = _round_up(k, NVFP4_BLOCK)
    x = np.zeros((m, kp), dtype=np.float32)
    x[:, :k] = (bits.astype(np.uint32) << 16).view(np.float32)
    blocks = x.reshape(m, kp // NVFP4_BLOCK, NVFP4_BLOCK)
    gsf = _F32(gsf)
    with np.errstate(all="ignore"):
        vmax = np.nanmax(np.where(np.isnan(blocks), _F32(0), np.abs(blocks)), axis=-1)
        per = gsf * (_F32(1.0) / _F32(6.0))
        want = (vmax * per).astype(np.float32)
        sf = _e4m3_encode(want.astype(np.float64))
        sf = np.where(vmax == 0, 0, sf).astype(np.uint8)
        sfd = (_e4m3_value(sf).astype(np.float32) * (_F32(1.0) / gsf)).astype(np.float32)
        out = np.minimum(_F32(1.0) / sfd, _F32(_FLT_MAX)).astype(np.float32)
        out = np.where(vmax == 0, _F32(0), out).astype(np.float32)
        v = (blocks * out[..., None]).astype(np.float32)
    codes = _e2m1_encode(v).reshape(m, kp)[:, :k]
    if k % 2:
        codes = np.concatenate([codes, np.zeros((m, 1), dtype=np.uint8)], axis=1)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, sf


# ---------------------------------------------------------------------------
# FlashInfer layouts
# ---------------------------------------------------------------------------

def swizzle_128x4(scales):
    """The 128x4 scale layout of block_scale_interleave / get_sf_out_offset_128x4
    (and vLLM's swizzle_mxfp8_scale): rows padded to 128 and scale columns to 4
    with zero bytes, then each [128, 4] tile stored as 32 rows of 16 bytes,
    row r of the tile at (r % 32) * 16 + (r / 32) * 4; tiles ordered by row
    tile, then column tile. [..., M, C] -> [..., Mp * Cp]."""
    *batch, m, c = scales.shape
    mp, cp = _round_up(m, SF_TILE_ROWS), _round_up(c, SF_TILE_COLS)
    padded = np.zeros(tuple(batch) + (mp, cp), dtype=np.uint8)
    padded[..., :m, :c] = scales
    tiles = padded.reshape(tuple(batch) + (mp // 128, 4, 32, cp // 4, 4))
    # (row tile, row / 32, row % 32, column tile, column % 4) ->
    # (row tile, column tile, row % 32, row / 32, column % 4)
    return np.swapaxes(tiles, -4, -2).reshape(tuple(batch) + (mp * cp,))


# flashinfer/utils.py srcToDstBlk32RowMap: within each 32-row block, source
# row i of the block lands on row _BLK32_DST[i] of the shuffled block.
_BLK32_DST = np.array([0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27,
                       4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31])


def shuffle_rows(m):
    """get_shuffle_matrix_a_row_indices(epilogue_tile_m=128): the row gather
    (output row j = input row idx[j]) of shuffle_matrix_a and
    shuffle_matrix_sf_a."""
    if m % SHUFFLE_BLOCK:
        raise ValueError(f"the epilogue-tile shuffle needs rows % 32 == 0, got {m}")
    src = np.arange(m)
    idx = np.empty(m, dtype=np.int64)
    idx[(src // SHUFFLE_BLOCK) * SHUFFLE_BLOCK + _BLK32_DST[src % SHUFFLE_BLOCK]] = src
    return idx


def gated_interleave_rows(m):
    """get_reorder_rows_for_gated_act_gemm_row_indices: output rows 2i and
    2i+1 take input rows i and m/2 + i."""
    idx = np.empty(m, dtype=np.int64)
    idx[0::2] = np.arange(m // 2)
    idx[1::2] = np.arange(m // 2, m)
    return idx


def _dense_layout(job, values, scales):
    """The dense MXFP8 backends (mxfp8-and-trtllm-layouts.md section 6).
    cutlass: vLLM Mxfp8OnlineLinearMethod keeps the [N, K] weight and stores
    swizzle_mxfp8_scale of the scales. cutedsl: the same bytes, viewed [K, N]
    (mm_mxfp8 takes b as the column-major [K, N] transpose). trtllm: N padded
    to 128 with zero rows, then shuffle_matrix_a on the weight and
    shuffle_matrix_sf_a (the same row gather, then the 128x4 layout) on the
    scales, as tests/gemm/test_mm_mxfp8.py prepares them; mm_mxfp8's trtllm
    runner requires K % 256 == 0 (gemm_base.py)."""
    n, k = values.shape
    if job.linear_backend == "flashinfer_trtllm":
        if k % 256:
            raise ValueError(f"flashinfer_trtllm dense MXFP8 needs K % 256 == 0, got K = {k}")
        np_rows = _round_up(n, SF_TILE_ROWS)
        padded_v = np.zeros((np_rows, k), dtype=np.uint8)
        padded_v[:n] = values
        padded_s = np.zeros((np_rows, scales.shape[1]), dtype=np.uint8)
        padded_s[:n] = scales
        idx = shuffle_rows(np_rows)
        values, scales = padded_v[idx], padded_s[idx]
    swizzled = swizzle_128x4(scales).reshape(_round_up(values.shape[0], SF_TILE_ROWS), -1)
    if job.linear_backend == "flashinfer_cutedsl":
        values = values.reshape(k, n)
    return values, swizzled


def _moe_layout(values13, scales13, values2, scales2):
    """prepare_fp8_moe_layer_for_fi with MXFP8 and TRT-LLM
    (flashinfer_utils.py): swap_w13_to_w31 turns [gate; up] into [up; gate]
    (values and scales), then _shuffle_mxfp8_moe_weights gathers w13 rows
    with the gated-activation interleave followed by the epilogue-tile
    shuffle (FlashInfer _maybe_get_cached_w3_w1_permute_indices composes them
    as interleave[shuffle]), w2 rows with the shuffle alone, and writes both
    scales in the 128x4 layout (block_scale_interleave), one block per
    expert."""
    rows13, rows2 = values13.shape[1], values2.shape[1]
    if rows13 % SF_TILE_ROWS or rows2 % SF_TILE_ROWS:
        raise ValueError(f"TRTLLM MoE needs 2I and H multiples of 128, got {rows13} and {rows2}")
    half = rows13 // 2

    def swap(x):
        return np.concatenate([x[:, half:], x[:, :half]], axis=1)

    idx13 = gated_interleave_rows(rows13)[shuffle_rows(rows13)]
    idx2 = shuffle_rows(rows2)
    return (swap(values13)[:, idx13], swizzle_128x4(swap(scales13)[:, idx13]),
            values2[:, idx2], swizzle_128x4(scales2[:, idx2]))


# ---------------------------------------------------------------------------
# The runtime tensors of one rank
# ---------------------------------------------------------------------------

def _fp8_block_full(job, w):
    """Every HF weight vLLM block-quantizes, quantized whole as NeMo-RL does
    before vLLM's loaders shard it: name -> (e4m3 values, float32 scale_inv).
    Cached on the job (the same weights for every rank)."""
    cache = getattr(job, "_fp8_cache", None)
    if cache is None or cache[0] is not w:
        cache = (w, {})
        job._fp8_cache = cache
    return cache[1]


def _fp8_q(job, w, name):
    table = _fp8_block_full(job, w)
    if name not in table:
        table[name] = fp8_block_quantize(w[name], pow2=job.fp8_scale == "pow2")
    return table[name]


def _blocks(n):
    return -(-n // FP8_BLOCK)


def _scale_rows(s, shard, size):
    """BlockQuantScaleParameter loading along the output dimension
    (linear.py, fp8_utils.py): shard `shard` of `size` weight rows is scale
    rows [shard * ceil(size/128), +ceil(size/128))."""
    return s[shard * _blocks(size):(shard + 1) * _blocks(size)]


def _scale_cols(s, shard, size):
    """The same along the input dimension (row-parallel layers)."""
    return s[:, shard * _blocks(size):(shard + 1) * _blocks(size)]


def _fp8_qkv(job, w, i, t):
    """qkv_proj under block FP8: each of q, k, v quantized whole, then its
    values sharded as the BF16 weight and its scale rows by block
    (QKVParallelLinear.weight_loader with adjust_block_scale_shard): one run of
    scale rows per piece."""
    d = job.head_dim
    q_loc = job.heads // job.tp
    kv_loc = max(1, job.kv_heads // job.tp)
    kv_shard = t // max(1, job.tp // job.kv_heads)
    values, scales = [], []
    for proj, shard, n in (("q_proj", t, q_loc * d), ("k_proj", kv_shard, kv_loc * d),
                           ("v_proj", kv_shard, kv_loc * d)):
        q, s = _fp8_q(job, w, _layer(i, f"self_attn.{proj}.weight"))
        values.append(_rows(q, shard * n, n))
        scales.append(_scale_rows(s, shard, n))
    return np.concatenate(values), np.concatenate(scales)


def _fp8_column_pair(job, w, gate, up, t, width):
    n = width // job.tp
    (qg, sg), (qu, su) = _fp8_q(job, w, gate), _fp8_q(job, w, up)
    return (np.concatenate([_rows(qg, t * n, n), _rows(qu, t * n, n)]),
            np.concatenate([_scale_rows(sg, t, n), _scale_rows(su, t, n)]))


def _fp8_row_parallel(job, w, name, t):
    q, s = _fp8_q(job, w, name)
    n = q.shape[1] // job.tp
    return _cols(q, t * n, n), _scale_cols(s, t, n)


def _fp8_store(out, module, suffix, values, scales):
    out[module + "." + suffix] = values
    out[module + "." + suffix + "_scale_inv"] = scales


class _Typed(np.ndarray):
    """An expected store whose element type refit names apart from what its
    numpy dtype says (NVFP4's packed uint8 weight, its E4M3 scales)."""
    refit_dtype = None


def _typed(array, name):
    view = np.ascontiguousarray(array).view(_Typed)
    view.refit_dtype = name
    return view


def _nvfp4_scale(job, w, pieces):
    """(gsf, weight_scale_2) of a runtime tensor made of the HF tensors
    `pieces`: each piece's amax over the WHOLE tensor (ModelOpt calibrates
    the unsharded weight), then their maximum, as
    ModelOptNvFp4LinearMethod.process_weights_after_loading keeps
    weight_scale_2.max() of a fused layer; the smallest gsf is the largest
    decode scale. Cached on the job."""
    cache = getattr(job, "_nvfp4_cache", None)
    if cache is None or cache[0] is not w:
        cache = (w, {})
        job._nvfp4_cache = cache
    table = cache[1]
    for name in pieces:
        if name not in table:
            table[name] = nvfp4_amax(w[name])
    return nvfp4_global_scale(max(table[name] for name in pieces))


def _nvfp4_linear(job, out, module, weight, pieces):
    """ModelOptNvFp4LinearMethod with FlashInfer's CUTLASS FP4 GEMM: the
    rank's BF16 shard quantized under the whole layer's global scale,
    weight uint8 [N, K/2] as loaded, weight_scale [N, K/16] E4M3 in the
    128x4 layout (rows padded to 128, scale columns to 4), weight_scale_2
    the one float32 decode scale [1]."""
    if weight.shape[1] % NVFP4_BLOCK:
        raise ValueError(f"{module}: K = {weight.shape[1]} is not a multiple of 16 "
                         f"(ModelOptNvFp4LinearMethod.create_weights refuses it)")
    gsf, decode = _nvfp4_scale(job, job._weights, pieces)
    packed, scales = nvfp4_quantize(weight, gsf)
    n = weight.shape[0]
    out[module + ".weight"] = _typed(packed, "uint8")
    out[module + ".weight_scale"] = _typed(
        swizzle_128x4(scales).reshape(_round_up(n, SF_TILE_ROWS), -1), "float8_e4m3fn")
    out[module + ".weight_scale_2"] = np.array([decode], dtype=np.float32)


def _linear(job, out, module, weight, pieces=()):
    """A linear's runtime tensors from its BF16 shard; `pieces` names the
    HF tensors it is made of (NVFP4's global scale is theirs, whole)."""
    if job.fp8_block and _quantized(job, module):
        raise ValueError(f"{module}: block FP8 quantizes whole HF tensors (_fp8_* helpers)")
    if job.nvfp4 and _quantized(job, module):
        _nvfp4_linear(job, out, module, weight, pieces)
        return
    if _quantized(job, module):
        values, scales = _dense_layout(job, *mxfp8_quantize(weight))
        out[module + ".weight"] = values
        out[module + ".weight_scale"] = scales
    else:
        out[module + ".weight"] = weight


def runtime_tensors(cfg, full_weights, tp_rank):
    """The runtime tensors of generator tp rank `tp_rank`: an ordered dict
    name -> numpy array of the bytes as stored (uint16 bfloat16, uint8 E4M3 /
    E8M0), in model order. `full_weights` maps every name of
    hf_tensor_shapes(cfg) to its full uint16 array."""
    job = _job(cfg)
    if not 0 <= tp_rank < job.tp:
        raise ValueError(f"tp_rank {tp_rank} outside generator tp {job.tp}")
    w, t = full_weights, tp_rank
    job._weights = w
    out = collections.OrderedDict()
    out["model.embed_tokens.weight"] = _vocab_shard(job, w["model.embed_tokens.weight"], t)
    for i in range(job.layers):
        if job.mla:
            out[_layer(i, "input_layernorm.weight")] = w[_layer(i, "input_layernorm.weight")]
            _mla(job, out, w, i, t)
            out[_layer(i, "post_attention_layernorm.weight")] = \
                w[_layer(i, "post_attention_layernorm.weight")]
            if job.moe_layer(i):
                _moe(job, out, w, i, t)
                if job.shared:
                    _gated_mlp(job, out, w, i, t, "mlp.shared_experts", job.shared * job.moe_ffn)
            else:
                _gated_mlp(job, out, w, i, t, "mlp", job.ffn)
            continue
        if job.fp8_block and _quantized(job, _layer(i, "self_attn.qkv_proj")):
            _fp8_store(out, _layer(i, "self_attn.qkv_proj"), "weight", *_fp8_qkv(job, w, i, t))
        else:
            _linear(job, out, _layer(i, "self_attn.qkv_proj"), _qkv(job, w, i, t),
                    [_layer(i, f"self_attn.{p}_proj.weight") for p in "qkv"])
        if job.qkv_bias:
            # Not a weight: MXFP8 (Mxfp8OnlineLinearMethod) quantizes only
            # the weight and keeps the layer's bias as it was created, BF16.
            out[_layer(i, "self_attn.qkv_proj.bias")] = _qkv(job, w, i, t, "bias")
        o = w[_layer(i, "self_attn.o_proj.weight")]
        o_loc = o.shape[1] // job.tp
        if job.fp8_block and _quantized(job, _layer(i, "self_attn.o_proj")):
            _fp8_store(out, _layer(i, "self_attn.o_proj"), "weight",
                       *_fp8_row_parallel(job, w, _layer(i, "self_attn.o_proj.weight"), t))
        else:
            _linear(job, out, _layer(i, "self_attn.o_proj"), _cols(o, t * o_loc, o_loc),
                    [_layer(i, "self_attn.o_proj.weight")])
        norms = ("self_attn.q_norm", "self_attn.k_norm") if job.qk_norm else ()
        for norm in norms + ("input_layernorm", "post_attention_layernorm"):
            out[_layer(i, norm + ".weight")] = w[_layer(i, norm + ".weight")]
        if job.moe:
            _moe(job, out, w, i, t)
        else:
            if job.fp8_block and _quantized(job, _layer(i, "mlp.gate_up_proj")):
                _fp8_store(out, _layer(i, "mlp.gate_up_proj"), "weight",
                           *_fp8_column_pair(job, w, _layer(i, "mlp.gate_proj.weight"),
                                             _layer(i, "mlp.up_proj.weight"), t, job.ffn))
            else:
                gate_up = _column_pair(job, w[_layer(i, "mlp.gate_proj.weight")],
                                       w[_layer(i, "mlp.up_proj.weight")], t, job.ffn)
                _linear(job, out, _layer(i, "mlp.gate_up_proj"), gate_up,
                        [_layer(i, "mlp.gate_proj.weight"), _layer(i, "mlp.up_proj.weight")])
            if job.fp8_block and _quantized(job, _layer(i, "mlp.down_proj")):
                _fp8_store(out, _layer(i, "mlp.down_proj"), "weight",
                           *_fp8_row_parallel(job, w, _layer(i, "mlp.down_proj.weight"), t))
            else:
                down = w[_layer(i, "mlp.down_proj.weight")]
                f_loc = job.ffn // job.tp
                _linear(job, out, _layer(i, "mlp.down_proj"), _cols(down, t * f_loc, f_loc),
                        [_layer(i, "mlp.down_proj.weight")])
    out["model.norm.weight"] = w["model.norm.weight"]
    if not job.tied:
        # Qwen3MoeForCausalLM (and Qwen2ForCausalLM, LlamaForCausalLM): with
        # tied embeddings lm_head *is* embed_tokens,
        # one tensor; otherwise ParallelLMHead pads and shards like the
        # embedding and is not a LinearBase, so it stays BF16.
        out["lm_head.weight"] = _vocab_shard(job, w["lm_head.weight"], t)
    return out


def _gated_mlp(job, out, w, i, t, module, width):
    """DeepseekV2MLP (the dense layers, and reduce_results=False for the
    shared experts, which stay on the dense tp group whatever the routed
    experts' ep): gate_up_proj = MergedColumnParallelLinear [gate_t; up_t],
    down_proj = RowParallelLinear, column block t."""
    if job.fp8_block and _quantized(job, _layer(i, f"{module}.gate_up_proj")):
        _fp8_store(out, _layer(i, f"{module}.gate_up_proj"), "weight",
                   *_fp8_column_pair(job, w, _layer(i, f"{module}.gate_proj.weight"),
                                     _layer(i, f"{module}.up_proj.weight"), t, width))
        _fp8_store(out, _layer(i, f"{module}.down_proj"), "weight",
                   *_fp8_row_parallel(job, w, _layer(i, f"{module}.down_proj.weight"), t))
        return
    gate_up = _column_pair(job, w[_layer(i, f"{module}.gate_proj.weight")],
                           w[_layer(i, f"{module}.up_proj.weight")], t, width)
    _linear(job, out, _layer(i, f"{module}.gate_up_proj"), gate_up)
    n = width // job.tp
    _linear(job, out, _layer(i, f"{module}.down_proj"),
            _cols(w[_layer(i, f"{module}.down_proj.weight")], t * n, n))


def _mla(job, out, w, i, t):
    """DeepseekV2MLAAttention (model-families.md 3.3) on tp rank t:
    fused_qkv_a_proj = [q_a_proj; kv_a_proj_with_mqa], whole on every rank
    (MergedColumnParallelLinear with disable_tp), then q_a_layernorm and
    q_b_proj (ColumnParallelLinear: row block t, whole heads); without q
    LoRA q_proj (row block t) and kv_a_proj_with_mqa (ReplicatedLinear);
    kv_a_layernorm; kv_b_proj (row block t); o_proj (RowParallelLinear:
    column block t). Every one of these linears is a LinearBase, which the
    MXFP8 config quantizes unless ignored (section 3.5); the norms never."""
    n_loc = job.heads // job.tp
    q_rows = n_loc * (job.nope + job.head_dim)
    kvb_rows = n_loc * (job.nope + job.v_dim)
    attn = lambda rest: w[_layer(i, f"self_attn.{rest}")]  # noqa: E731
    if job.fp8_block:
        _mla_fp8_block(job, out, w, i, t, q_rows, kvb_rows, n_loc * job.v_dim)
        return
    if job.q_lora:
        _linear(job, out, _layer(i, "self_attn.fused_qkv_a_proj"),
                np.concatenate([attn("q_a_proj.weight"), attn("kv_a_proj_with_mqa.weight")]))
        out[_layer(i, "self_attn.q_a_layernorm.weight")] = attn("q_a_layernorm.weight")
        _linear(job, out, _layer(i, "self_attn.q_b_proj"),
                _rows(attn("q_b_proj.weight"), t * q_rows, q_rows))
    else:
        _linear(job, out, _layer(i, "self_attn.q_proj"),
                _rows(attn("q_proj.weight"), t * q_rows, q_rows))
        _linear(job, out, _layer(i, "self_attn.kv_a_proj_with_mqa"),
                attn("kv_a_proj_with_mqa.weight"))
    out[_layer(i, "self_attn.kv_a_layernorm.weight")] = attn("kv_a_layernorm.weight")
    _linear(job, out, _layer(i, "self_attn.kv_b_proj"),
            _rows(attn("kv_b_proj.weight"), t * kvb_rows, kvb_rows))
    o_cols = n_loc * job.v_dim
    _linear(job, out, _layer(i, "self_attn.o_proj"), _cols(attn("o_proj.weight"), t * o_cols, o_cols))


def _mla_fp8_block(job, out, w, i, t, q_rows, kvb_rows, o_cols):
    """_mla under block FP8 (Fp8LinearMethod for every MLA linear not
    ignored, model-families.md 3.5 and 4.1): each HF tensor quantized whole,
    then loaded as the BF16 weight is, its scale rows by block; the fused
    fused_qkv_a_proj keeps one run of scale rows per piece; kv_b_proj adds
    the BF16 buffer W_UK_T and W_UV are views of, scaled_dequantize of the
    rank's kv_b_proj (3.4), as "kv_b_proj.weight_dequant"."""
    def name(rest):
        return _layer(i, f"self_attn.{rest}")

    def column(module, hf, rows):
        if not _quantized(job, name(module)):
            _linear(job, out, name(module), _rows(w[name(hf)], t * rows, rows))
            return
        q, s = _fp8_q(job, w, name(hf))
        values, scales = _rows(q, t * rows, rows), _scale_rows(s, t, rows)
        _fp8_store(out, name(module), "weight", values, scales)
        if module == "kv_b_proj":
            out[name("kv_b_proj.weight_dequant")] = fp8_block_dequantize(values, scales)

    def replicated(module, pieces):
        if not _quantized(job, name(module)):
            _linear(job, out, name(module), np.concatenate([w[name(p)] for p in pieces]))
            return
        qs = [_fp8_q(job, w, name(p)) for p in pieces]
        _fp8_store(out, name(module), "weight", np.concatenate([q for q, _ in qs]),
                   np.concatenate([s for _, s in qs]))

    if job.q_lora:
        replicated("fused_qkv_a_proj", ["q_a_proj.weight", "kv_a_proj_with_mqa.weight"])
        out[name("q_a_layernorm.weight")] = w[name("q_a_layernorm.weight")]
        column("q_b_proj", "q_b_proj.weight", q_rows)
    else:
        column("q_proj", "q_proj.weight", q_rows)
        replicated("kv_a_proj_with_mqa", ["kv_a_proj_with_mqa.weight"])
    out[name("kv_a_layernorm.weight")] = w[name("kv_a_layernorm.weight")]
    column("kv_b_proj", "kv_b_proj.weight", kvb_rows)
    if _quantized(job, name("o_proj")):
        _fp8_store(out, name("o_proj"), "weight",
                   *_fp8_row_parallel(job, w, name("o_proj.weight"), t))
    else:
        _linear(job, out, name("o_proj"), _cols(w[name("o_proj.weight")], t * o_cols, o_cols))


def mla_derived(job, kv_b_proj):
    """W_UK_T and W_UV as MLAAttention.process_weights_after_loading makes
    them from a BF16 kv_b_proj shard [N_loc (P + Vd), kv_r]
    (layers/attention/mla_attention.py; model-families.md 3.4):
    W.T.view(kv_r, N_loc, P + Vd).split([P, Vd], -1), then W_UK permuted to
    [N_loc, P, kv_r] and W_UV transposed to [N_loc, kv_r, Vd]. get_and_maybe_
    dequant_weights returns the weight itself when its dtype is already the
    activation dtype, and none of these steps copies: both are strided views
    of kv_b_proj's storage, so numpy views stand for them here."""
    n_loc = job.heads // job.tp
    view = kv_b_proj.T.reshape(job.kv_lora, n_loc, job.nope + job.v_dim)
    w_uk, w_uv = view[..., :job.nope], view[..., job.nope:]
    return w_uk.transpose(1, 2, 0), w_uv.transpose(1, 0, 2)


def kv_b_proj_dequantized(job, full_weights, layer):
    """The whole kv_b_proj as block FP8 makes it: quantized whole (NeMo-RL),
    then dequantized by scaled_dequantize. Row blocks of 128 never straddle
    two tp ranks' shards (vLLM's block check), so each rank's dequantized
    shard is these rows of it."""
    q, s = fp8_block_quantize(full_weights[_layer(layer, "self_attn.kv_b_proj.weight")],
                              pow2=job.fp8_scale == "pow2")
    return fp8_block_dequantize(q, s)


def mla_derived_expected(job, full_weights, layer, tp_rank):
    """W_UK_T and W_UV of one rank from the checkpoint, element by element
    (W_UK_T[n, p, l] = kv_b_proj[(n0 + n)(P + Vd) + p, l] and W_UV[n, l, v] =
    kv_b_proj[(n0 + n)(P + Vd) + P + v, l], n0 = t N / tp): written from the
    formula, not from the view chain above."""
    n_loc = job.heads // job.tp
    per = job.nope + job.v_dim
    kv_b = full_weights[_layer(layer, "self_attn.kv_b_proj.weight")]
    uk = np.empty((n_loc, job.nope, job.kv_lora), dtype=kv_b.dtype)
    uv = np.empty((n_loc, job.kv_lora, job.v_dim), dtype=kv_b.dtype)
    for n in range(n_loc):
        head = (tp_rank * n_loc + n) * per
        for p in range(job.nope):
            uk[n, p, :] = kv_b[head + p, :]
        for v in range(job.v_dim):
            uv[n, :, v] = kv_b[head + job.nope + v, :]
    return uk, uv


def _moe(job, out, w, i, t):
    # The router: ReplicatedLinear(quant_config=None) (Qwen3-MoE; DeepSeek's
    # GateLinear likewise), replicated and BF16; DeepSeek's score-correction
    # bias beside it, replicated and float32 under every quantization.
    out[_layer(i, "mlp.gate.weight")] = w[_layer(i, "mlp.gate.weight")]
    if job.expert_bias:
        out[_layer(i, EXPERT_BIAS)] = w[_layer(i, EXPERT_BIAS)]
    w13, w2 = _experts(job, w, i, t)
    module = _layer(i, "mlp.experts")
    if not _quantized(job, module):
        out[module + ".w13_weight"], out[module + ".w2_weight"] = w13, w2
        return
    if job.fp8_block:
        _fp8_experts(job, out, w, i, t, module)
        return
    if job.nvfp4:
        _nvfp4_experts(job, out, w, i, t, module)
        return
    # Mxfp8OnlineMoEMethod quantizes expert by expert along K (H for w13, I
    # for w2); blocks never span rows, so quantizing the stack is the same.
    v13, s13, v2, s2 = _moe_layout(*mxfp8_quantize(w13), *mxfp8_quantize(w2))
    out[module + ".w13_weight"], out[module + ".w13_weight_scale"] = v13, s13
    out[module + ".w2_weight"], out[module + ".w2_weight_scale"] = v2, s2


def _fp8_experts(job, out, w, i, t, module):
    """Fp8MoEMethod with a weight_block_size (fp8.py create_weights): w13
    [E_loc, 2I_loc, H] with w13_weight_scale_inv [E_loc, 2 ceil(I_loc/128),
    ceil(H/128)] (gate block rows, then up), w2 [E_loc, H, I_loc] with
    w2_weight_scale_inv [E_loc, ceil(H/128), ceil(I_loc/128)]; each expert's
    HF tensors quantized whole, then sharded by FusedMoE's loaders."""
    shard_tp = job.tp if job.ep == 1 else 1
    shard_t = t if job.ep == 1 else 0
    n = job.moe_ffn // shard_tp
    v13, s13, v2, s2 = [], [], [], []
    for e in _expert_range(job, t):
        pre = f"mlp.experts.{e}"
        (qg, sg), (qu, su) = (_fp8_q(job, w, _layer(i, f"{pre}.gate_proj.weight")),
                              _fp8_q(job, w, _layer(i, f"{pre}.up_proj.weight")))
        v13.append(np.concatenate([_rows(qg, shard_t * n, n), _rows(qu, shard_t * n, n)]))
        s13.append(np.concatenate([_scale_rows(sg, shard_t, n), _scale_rows(su, shard_t, n)]))
        qd, sd = _fp8_q(job, w, _layer(i, f"{pre}.down_proj.weight"))
        v2.append(_cols(qd, shard_t * n, n))
        s2.append(_scale_cols(sd, shard_t, n))
    _fp8_store(out, module, "w13_weight", np.stack(v13), np.stack(s13))
    _fp8_store(out, module, "w2_weight", np.stack(v2), np.stack(s2))


def dtype_name(name, array):
    """The element type a runtime store holds, as refit's dump names it."""
    if getattr(array, "refit_dtype", None):
        return array.refit_dtype
    if array.dtype == np.uint16:
        return "bfloat16"
    if array.dtype == np.float32:
        return "float32"
    return "e8m0" if name.endswith("_scale") else "float8_e4m3fn"


def _nvfp4_moe_check(job, rows13, hidden, inter):
    """The shapes vLLM serves without padding the experts (flashinfer_fp4_moe.py
    prepare_nvfp4_moe_layer_for_fi_or_cutlass): group size 16 along both K;
    the CUTLASS path raises NotImplementedError when a gated w13's swizzled
    scale has more rows than w13 (2I not a multiple of 128); the TRTLLM path
    pads the intermediate size to 64 (align_fp4_moe_weights_for_fi) and the
    hidden size to 256 (align_trtllm_fp4_moe_hidden_dim_for_fi), and
    shuffle_matrix_sf_a asserts 128-row scale tiles. Padding is refused
    here, as refit's config refuses it."""
    if hidden % NVFP4_BLOCK or inter % NVFP4_BLOCK:
        raise ValueError(f"NVFP4 experts need H and I multiples of 16, got {hidden}, {inter}")
    if rows13 % SF_TILE_ROWS:
        raise ValueError(f"NVFP4 experts need 2I % 128 == 0, got 2I = {rows13}")
    if job.moe_backend == "flashinfer_trtllm" and hidden % 256:
        raise ValueError(f"flashinfer_trtllm NVFP4 experts need H % 256 == 0, got {hidden}")


def _nvfp4_experts(job, out, w, i, t, module):
    """ModelOptNvFp4FusedMoE (modelopt.py) after process_weights_after_loading.
    create_weights: w13_weight uint8 [E, 2I, H/2] ([gate; up] per expert as
    the loaders place them), w13_weight_scale E4M3 [E, 2I, H/16],
    w13_weight_scale_2 [E, 2]; w2 likewise [E, H, I/2], [E, H, I/16], [E].
    Each expert's gate, up and down are quantized by ModelOpt as whole
    tensors, so each piece's global scale comes from its whole HF tensor;
    vLLM then keeps w13_weight_scale_2[:, 0] (the gate's) and warns when it
    differs from the up's, so the scale written is one value for both:
    the max of their amax (the smallest gsf). Then
    prepare_nvfp4_moe_layer_for_fi_or_cutlass: reorder_w1w3_to_w3w1 on the
    packed rows and the linear scale rows ([up; gate]); TRTLLM:
    prepare_static_weights_for_trtllm_fp4_moe per expert, rows of w13
    (weight and linear scales) gathered by the gated-activation interleave
    then the 128-tile epilogue shuffle (_maybe_get_cached_w3_w1_permute_
    indices composes them as interleave[shuffle]), w2's by the shuffle alone,
    scales then block_scale_interleave'd (128x4) per expert; CUTLASS: weights
    as swapped, scales swizzle_blockscale'd (128x4) per expert."""
    shard_tp = job.tp if job.ep == 1 else 1
    shard_t = t if job.ep == 1 else 0
    n = job.moe_ffn // shard_tp
    _nvfp4_moe_check(job, 2 * n, job.hidden, n)
    trtllm = job.moe_backend == "flashinfer_trtllm"
    idx13 = (gated_interleave_rows(2 * n)[shuffle_rows(2 * n)] if trtllm
             else np.arange(2 * n))
    idx2 = shuffle_rows(job.hidden) if trtllm else np.arange(job.hidden)

    def swap(x):
        return np.concatenate([x[n:], x[:n]])

    p13, s13, d13, p2, s2, d2 = [], [], [], [], [], []
    for e in _expert_range(job, t):
        pre = f"mlp.experts.{e}"
        gate, up = _layer(i, f"{pre}.gate_proj.weight"), _layer(i, f"{pre}.up_proj.weight")
        down = _layer(i, f"{pre}.down_proj.weight")
        gsf, decode = _nvfp4_scale(job, w, [gate, up])
        shard = np.concatenate([_rows(w[gate], shard_t * n, n), _rows(w[up], shard_t * n, n)])
        packed, scales = nvfp4_quantize(shard, gsf)
        p13.append(swap(packed)[idx13])
        s13.append(swizzle_128x4(swap(scales)[idx13]).reshape(
            _round_up(2 * n, SF_TILE_ROWS), -1))
        d13.append(decode)
        gsf, decode = _nvfp4_scale(job, w, [down])
        packed, scales = nvfp4_quantize(_cols(w[down], shard_t * n, n), gsf)
        p2.append(packed[idx2])
        s2.append(swizzle_128x4(scales[idx2]).reshape(_round_up(job.hidden, SF_TILE_ROWS), -1))
        d2.append(decode)
    for name, packed, scales, decode in (("w13_weight", p13, s13, d13),
                                         ("w2_weight", p2, s2, d2)):
        out[f"{module}.{name}"] = _typed(np.stack(packed), "uint8")
        out[f"{module}.{name}_scale"] = _typed(np.stack(scales), "float8_e4m3fn")
        out[f"{module}.{name}_scale_2"] = np.array(decode, dtype=np.float32)

"""What a Megatron-Core trainer rank holds, stated from Megatron-Core's rules.

An independent statement for tests: it shares no code and no tables with
refit's catalog (reshard/catalog_megatron.c). Given the full Hugging Face weights of a
Qwen3, Qwen3-MoE, Llama, Qwen2 or DeepSeek-V3 model (numpy uint16 arrays of bfloat16 bits) and a refit
config, it returns the tensors one trainer rank holds, under the names
Megatron-Core's GPTModel.named_parameters() gives them and with the values
Megatron's own layout puts in them (Megatron-LM d98e8a64; the rules are in
the project's shared reference, framework-layouts.md):

- Rank order within a pipeline stage: tensor parallel fastest, then data
  parallel (megatron/core/parallel_state.py, "tp-cp-ep-dp-pp"); expert layers
  re-view the stage's tp*dp ranks as etp (fastest) x ep x edp (MoE parallel
  folding).
- Layers are numbered within their stage: decoder.layers.{i} is global layer
  stage_first + i.
- linear_qkv: rows grouped by query group, [q heads of the group, its K head,
  its V head] (attention.py get_query_key_value_tensors); a tp rank holds a
  contiguous 1/tp of the rows. Qwen2's linear_qkv.bias is interleaved and
  split the same way, element for element (Megatron-Bridge qwen2_bridge.py:
  add_qkv_bias, a QKVMapping on the bias as on the weight), under the same
  name in both specs.
- q_layernorm / k_layernorm exist only where the model has q/k norms
  (Qwen3: qk_layernorm=True); Llama and Qwen2 have none.
- linear_fc1: tp rank r holds [gate rows of r; up rows of r] (mlp.py, and
  the same per expert over etp).
- Experts: global id = ep_rank * (E / ep) + k; grouped GEMM names them
  linear_fc1.weight{k}, SequentialMLP local_experts.{k}.linear_fc1.weight.
- The Transformer Engine spec fuses the input norm into linear_qkv
  (layer_norm_weight) and a dense layer's pre-MLP norm into linear_fc1;
  MoE layers keep pre_mlp_layernorm under both specs.
- The vocabulary is padded to a multiple of make_vocab_size_divisible_by *
  tp; padded rows are not part of the model (here: random, never sent).
- DeepSeek-V3 (model-families.md 3.2; Megatron-LM multi_latent_attention.py
  MLASelfAttention, Megatron-Bridge deepseek/common.py): the input norm stays
  input_layernorm.weight under both specs; linear_q_down_proj and
  linear_kv_down_proj are whole on every tp rank under TE (duplicated) and
  row-split ColumnParallelLinears under the local spec; their norms are
  linear_q_up_proj / linear_kv_up_proj.layer_norm_weight under TE and
  q_layernorm / kv_layernorm under the local spec; linear_q_up_proj
  (linear_q_proj without q LoRA), linear_kv_up_proj row-split, in Hugging
  Face's row order; a layer below first_k_dense_replace is a dense MLP
  layer, the others MoE with mlp.shared_experts.linear_fc1 ([gate_t; up_t]
  over the dense tp group) and linear_fc2, and with expert_bias
  mlp.router.expert_bias, the router's FP32 buffer, whole on every rank.
"""

import numpy as np


def _stage_layers(cfg):
    """[first, last) global layers of each pipeline stage (refit's config
    rule: the stages not given split what the given ones leave)."""
    m, t = cfg["model"], cfg.get("trainer", {})
    layers, pp = m["num_layers"], t.get("pp", 1)
    first, last = t.get("first_stage_layers", 0), t.get("last_stage_layers", 0)
    counts = [None] * pp
    if pp > 1 and first:
        counts[0] = first
    if pp > 1 and last:
        counts[-1] = last
    free = [s for s in range(pp) if counts[s] is None]
    rest = layers - sum(c for c in counts if c is not None)
    for s in free:
        counts[s] = rest // len(free)
    bounds, at = [], 0
    for c in counts:
        bounds.append((at, at + c))
        at += c
    return bounds


def rank_coords(cfg, rank):
    """(stage, tp, dp, etp, ep) of trainer rank `rank`."""
    t = cfg.get("trainer", {})
    tp, dp = t.get("tp", 1), t.get("dp", 1)
    ep, etp = t.get("ep", 1), t.get("etp", 1)
    stage, q = divmod(rank, tp * dp)
    return stage, q % tp, q // tp, q % etp, (q // etp) % ep


def _split(w, parts, index, axis):
    n = w.shape[axis] // parts
    return np.take(w, np.arange(index * n, (index + 1) * n), axis=axis)


def _fc1(gate, up, parts, index):
    """[gate_r; up_r] of one tp (or etp) rank."""
    return np.concatenate([_split(gate, parts, index, 0), _split(up, parts, index, 0)])


def _qkv(m, q, k, v):
    """The global linear_qkv (weight rows, or bias elements): per query
    group, its q heads, K head, V head."""
    d, groups = m["head_dim"], m["num_kv_heads"]
    per = m["num_attention_heads"] // groups
    rows = []
    for g in range(groups):
        rows += [q[g * per * d:(g + 1) * per * d], k[g * d:(g + 1) * d], v[g * d:(g + 1) * d]]
    return np.concatenate(rows)


def _padded(w, rows, rng):
    """`w` with random rows appended up to `rows`: Megatron's padding rows hold
    whatever the trainer has there; refit must never send them."""
    pad = rng.integers(0, 1 << 16, size=(rows - w.shape[0], w.shape[1]), dtype=np.uint16)
    return np.concatenate([w, pad])


def _is_moe_layer(m, layer):
    """Qwen3-MoE: every layer; DeepSeek: layer >= first_k_dense_replace and
    a multiple of moe_layer_freq (Bridge's moe_layer_freq list)."""
    if m["family"] == "qwen3_moe":
        return True
    if m["family"] != "deepseek_v3":
        return False
    freq = m.get("moe_layer_freq", 0) or 1
    return layer >= m.get("first_k_dense_replace", 0) and layer % freq == 0


def _mla(put, p, hf, m, te, tp, tpr):
    """One layer's multi-latent attention (see the module docstring)."""
    put(p + "input_layernorm.weight", hf("input_layernorm.weight"))

    def down(w):
        return w if te else _split(w, tp, tpr, 0)

    a = "self_attention."
    if m.get("q_lora_rank", 0):
        put(p + a + "linear_q_down_proj.weight", down(hf("self_attn.q_a_proj.weight")))
        put(p + a + ("linear_q_up_proj.layer_norm_weight" if te else "q_layernorm.weight"),
            hf("self_attn.q_a_layernorm.weight"))
        put(p + a + "linear_q_up_proj.weight", _split(hf("self_attn.q_b_proj.weight"), tp, tpr, 0))
    else:
        put(p + a + "linear_q_proj.weight", _split(hf("self_attn.q_proj.weight"), tp, tpr, 0))
    put(p + a + "linear_kv_down_proj.weight", down(hf("self_attn.kv_a_proj_with_mqa.weight")))
    put(p + a + ("linear_kv_up_proj.layer_norm_weight" if te else "kv_layernorm.weight"),
        hf("self_attn.kv_a_layernorm.weight"))
    put(p + a + "linear_kv_up_proj.weight", _split(hf("self_attn.kv_b_proj.weight"), tp, tpr, 0))


def trainer_tensors(cfg, full, rank, rng):
    """Ordered dict name -> uint16 array: what Megatron trainer rank `rank`
    holds for the Hugging Face weights `full`."""
    m, t = cfg["model"], cfg.get("trainer", {})
    mla = m["family"] == "deepseek_v3"
    qk_norm = m["family"] in ("qwen3", "qwen3_moe")
    qkv_bias = m["family"] == "qwen2"
    tp, ep, etp = t.get("tp", 1), t.get("ep", 1), t.get("etp", 1)
    te = t.get("spec", "te") == "te"
    experts = t.get("experts", "auto")
    grouped = experts == "grouped" or (experts == "auto" and te)
    prefix = t.get("name_prefix", "")
    stage, tpr, _, etpr, epr = rank_coords(cfg, rank)
    bounds = _stage_layers(cfg)
    pp = len(bounds)
    vocab = m["vocab_size"]
    div = t.get("vocab_divisible_by", 128) * tp
    vpad = (vocab + div - 1) // div * div
    out = {}

    def put(name, value):
        out[prefix + name] = np.ascontiguousarray(value)

    if stage == 0:
        put("embedding.word_embeddings.weight",
            _split(_padded(full["model.embed_tokens.weight"], vpad, rng), tp, tpr, 0))
    first, last = bounds[stage]
    for layer in range(first, last):
        hf = lambda rest: full[f"model.layers.{layer}.{rest}"]  # noqa: E731
        p = f"decoder.layers.{layer - first}."
        moe = _is_moe_layer(m, layer)
        if mla:
            _mla(put, p, hf, m, te, tp, tpr)
        else:
            put(p + ("self_attention.linear_qkv.layer_norm_weight" if te
                     else "input_layernorm.weight"), hf("input_layernorm.weight"))
            qkv = _qkv(m, hf("self_attn.q_proj.weight"), hf("self_attn.k_proj.weight"),
                       hf("self_attn.v_proj.weight"))
            put(p + "self_attention.linear_qkv.weight", _split(qkv, tp, tpr, 0))
        if qkv_bias:
            bias = _qkv(m, hf("self_attn.q_proj.bias"), hf("self_attn.k_proj.bias"),
                        hf("self_attn.v_proj.bias"))
            put(p + "self_attention.linear_qkv.bias", _split(bias, tp, tpr, 0))
        if qk_norm:
            put(p + "self_attention.q_layernorm.weight", hf("self_attn.q_norm.weight"))
            put(p + "self_attention.k_layernorm.weight", hf("self_attn.k_norm.weight"))
        put(p + "self_attention.linear_proj.weight", _split(hf("self_attn.o_proj.weight"), tp, tpr, 1))
        norm = hf("post_attention_layernorm.weight")
        if not moe:
            put(p + ("mlp.linear_fc1.layer_norm_weight" if te else "pre_mlp_layernorm.weight"), norm)
            put(p + "mlp.linear_fc1.weight",
                _fc1(hf("mlp.gate_proj.weight"), hf("mlp.up_proj.weight"), tp, tpr))
            put(p + "mlp.linear_fc2.weight", _split(hf("mlp.down_proj.weight"), tp, tpr, 1))
            continue
        put(p + "pre_mlp_layernorm.weight", norm)
        put(p + "mlp.router.weight", hf("mlp.gate.weight"))
        if mla and m.get("expert_bias", False):
            # TopKRouter's expert_bias: an FP32 buffer (named_buffers()).
            put(p + "mlp.router.expert_bias", hf("mlp.gate.e_score_correction_bias"))
        local = m["num_experts"] // ep
        for k in range(local):
            e = epr * local + k
            fc1 = _fc1(hf(f"mlp.experts.{e}.gate_proj.weight"), hf(f"mlp.experts.{e}.up_proj.weight"),
                       etp, etpr)
            fc2 = _split(hf(f"mlp.experts.{e}.down_proj.weight"), etp, etpr, 1)
            if grouped:
                put(p + f"mlp.experts.linear_fc1.weight{k}", fc1)
                put(p + f"mlp.experts.linear_fc2.weight{k}", fc2)
            else:
                put(p + f"mlp.experts.local_experts.{k}.linear_fc1.weight", fc1)
                put(p + f"mlp.experts.local_experts.{k}.linear_fc2.weight", fc2)
        if mla and m.get("num_shared_experts", 0):
            # SharedExpertMLP: the dense tp group, not etp.
            put(p + "mlp.shared_experts.linear_fc1.weight",
                _fc1(hf("mlp.shared_experts.gate_proj.weight"),
                     hf("mlp.shared_experts.up_proj.weight"), tp, tpr))
            put(p + "mlp.shared_experts.linear_fc2.weight",
                _split(hf("mlp.shared_experts.down_proj.weight"), tp, tpr, 1))
    if stage == pp - 1:
        put("decoder.final_layernorm.weight", full["model.norm.weight"])
        tied = m.get("tie_word_embeddings", False)
        if not tied:
            put("output_layer.weight", _split(_padded(full["lm_head.weight"], vpad, rng), tp, tpr, 0))
        elif pp > 1:
            # The last stage keeps its copy of the tied embedding.
            put("output_layer.weight",
                _split(_padded(full["model.embed_tokens.weight"], vpad, rng), tp, tpr, 0))
    return out

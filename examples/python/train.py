"""A torch trainer on refit: a small Qwen3-MoE under Megatron-Core's
parameter names (decoder.layers.{i}.self_attention.linear_qkv.weight, fused
[q.. k v] per query group; mlp.experts.linear_fc1.weight{k} = [gate; up];
see ../shared/reference/framework-layouts.md) takes real optimizer steps
on a next-token loss, and after each step refits its bfloat16 weights into
the inference engine (engine.py).

As in Megatron's mixed precision, the optimizer updates float32 main
parameters and copies them into the bfloat16 model parameters; those are
what refit reads, in place (source.kind caller).

    launch/refit-launch examples/python/moe.yaml -- build/venv/bin/python examples/python/run.py examples/python/moe.yaml
    build/venv/bin/python examples/python/train.py CONFIG --join PORT_FILE   # a separate trainer job

With refit.delta: on in the config, every refit after the first sends only
the bytes the optimizer step changed (at --lr 1e-5 a small share of the
bfloat16 weights crosses a rounding boundary per step); each step prints
what went on the wire.
"""

import argparse

import torch
import torch.nn.functional as F
import yaml

import refit


class MegatronModel(torch.nn.Module):
    """Parameters under exactly the names refit expects on this rank
    (Megatron-Core's named_parameters()), as nested modules."""

    def __init__(self, expected, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        for name, shape, dtype in expected:
            assert dtype == torch.bfloat16, (name, dtype)
            *path, leaf = name.split(".")
            m = self
            for part in path:
                if not hasattr(m, part):
                    m.add_module(part, torch.nn.Module())
                m = getattr(m, part)
            norm = "norm" in leaf or "layer_norm" in leaf
            init = torch.ones(shape) if norm else torch.randn(shape, generator=g) * 0.02
            m.register_parameter(leaf, torch.nn.Parameter(init.reshape(-1) if norm else init))


def rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def moe_block(p, layer, x, m):
    """Top-2 routed experts of one layer from Megatron-Core's tensors."""
    pre = "decoder.layers.%d." % layer
    h = rms_norm(x, p[pre + "pre_mlp_layernorm.weight"])
    probs = torch.softmax(h @ p[pre + "mlp.router.weight"].t(), -1)
    weights, experts = torch.topk(probs, 2, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    inter = m["moe_intermediate_size"]
    out = torch.zeros_like(x)
    for e in range(m["num_experts"]):
        fc1 = p[pre + "mlp.experts.linear_fc1.weight%d" % e]
        fc2 = p[pre + "mlp.experts.linear_fc2.weight%d" % e]
        sel = (experts == e)
        rows = sel.any(-1)
        if not rows.any():
            continue
        g_u = h[rows] @ fc1.t()
        act = F.silu(g_u[:, :inter]) * g_u[:, inter:]
        w = (weights * sel)[rows].sum(-1, keepdim=True)
        out[rows] += w * (act @ fc2.t())
    return out


def attention(p, layer, x, m):
    pre = "decoder.layers.%d.self_attention." % layer
    nq, nkv, d = m["num_attention_heads"], m["num_kv_heads"], m["head_dim"]
    h = rms_norm(x, p[pre + "linear_qkv.layer_norm_weight"])
    qkv = (h @ p[pre + "linear_qkv.weight"].t()).view(x.shape[0], nkv, nq // nkv + 2, d)
    q, k, v = qkv[:, :, :-2], qkv[:, :, -2:-1], qkv[:, :, -1:]
    q = rms_norm(q, p[pre + "q_layernorm.weight"])
    k = rms_norm(k, p[pre + "k_layernorm.weight"])
    t = x.shape[0]
    scores = torch.einsum("sgqd,tgkd->gqst", q, k) / d ** 0.5
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.einsum("gqst,tgkd->sgqd", torch.softmax(scores, -1), v).reshape(t, nq * d)
    return o @ p[pre + "linear_proj.weight"].t()


def loss_fn(p, tokens, m):
    x = p["embedding.word_embeddings.weight"][tokens[:-1]]
    for layer in range(m["num_layers"]):
        x = x + attention(p, layer, x, m)
        x = x + moe_block(p, layer, x, m)
    x = rms_norm(x, p["decoder.final_layernorm.weight"])
    logits = x @ p["output_layer.weight"].t()
    return F.cross_entropy(logits[:, :m["vocab_size"]], tokens[1:])


def probe(cfg):
    """The input both sides run the MoE block of layer 0 on."""
    return torch.randn(8, cfg["model"]["hidden_size"], generator=torch.Generator().manual_seed(3))


def run(s, cfg, steps, lr=3e-3):
    m = cfg["model"]
    main = MegatronModel(s.expected())                    # float32 main parameters
    model = MegatronModel(s.expected())                   # bfloat16 model parameters
    model.to(torch.bfloat16).requires_grad_(False)
    s.register_all(model.named_parameters())
    opt = torch.optim.AdamW(main.parameters(), lr=lr)
    # One fixed batch: the loss falls as the model memorizes it.
    tokens = torch.randint(0, m["vocab_size"], (65,), generator=torch.Generator().manual_seed(1))
    first_gen = s.comm.size - cfg.get("generator", {}).get("tp", 1) * \
        cfg.get("generator", {}).get("engines", 1)
    for step in range(1, steps + 1):
        loss = loss_fn(dict(main.named_parameters()), tokens, m)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            for (_, dst), (_, src) in zip(model.named_parameters(), main.named_parameters()):
                dst.copy_(src.reshape(dst.shape))
        times = s.refit(step)
        wire = s.last_wire_stats()  # this rank's share
        # What the engine must compute from its vLLM tensors: the same block
        # from the bfloat16 weights just sent.
        with torch.no_grad():
            p = {n: t.float() for n, t in model.named_parameters()}
            want = moe_block(p, 0, probe(cfg), m)
        if s.comm.rank == 0:
            for r in range(first_gen, s.comm.size):
                s.comm.send(want, dest=r, tag=step)
            print("train: step %d loss %.4f, refit %.4f s (pack %.4f, transfer %.4f, commit %.4f)"
                  % (step, loss.item(), times["total"], times["pack"], times["transfer"],
                     times["commit"]), flush=True)
            if wire["full_bytes"]:  # refit.delta on or auto
                print("train: step %d was a %s refit: rank 0 sent %d of %d bytes (%.4f)"
                      % (step, "delta" if wire["delta"] else "full", wire["wire_bytes"],
                         wire["full_bytes"], wire["wire_bytes"] / wire["full_bytes"]),
                      flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--join", metavar="PORT_FILE")
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()
    cfg = yaml.safe_load(open(args.config))
    join = {"side": "trainer", "port_file": args.join} if args.join else None
    with refit.Session(args.config, join=join) as s:
        run(s, cfg, args.steps, args.lr)


if __name__ == "__main__":
    main()

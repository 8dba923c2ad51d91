"""An inference engine on refit: it owns vLLM-named runtime tensors
(model.layers.{i}.mlp.experts.w13_weight = [gate; up] per expert, w2_weight,
mlp.gate.weight, ...), allocated by torch and registered once, and serves a
forward of one MoE block from them between refit_progress calls (async mode:
the committed version stays intact until commit). After each commit it
checks its block against the one the trainer computed from its
Megatron-Core tensors, and prints the per-step refit times.

    build/venv/bin/python examples/python/engine.py CONFIG --join PORT_FILE   # a separate engine job
"""

import argparse

import torch
import torch.nn.functional as F
import yaml

import refit
from train import probe, rms_norm


def moe_block(t, layer, x, m):
    """Top-2 routed experts of one layer from vLLM's runtime tensors."""
    pre = "model.layers.%d." % layer
    h = rms_norm(x, t[pre + "post_attention_layernorm.weight"].float())
    probs = torch.softmax(h @ t[pre + "mlp.gate.weight"].float().t(), -1)
    weights, experts = torch.topk(probs, 2, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    w13 = t[pre + "mlp.experts.w13_weight"].float()
    w2 = t[pre + "mlp.experts.w2_weight"].float()
    inter = w13.shape[1] // 2
    out = torch.zeros_like(x)
    for e in range(w13.shape[0]):
        sel = (experts == e)
        rows = sel.any(-1)
        if not rows.any():
            continue
        g_u = h[rows] @ w13[e].t()
        act = F.silu(g_u[:, :inter]) * g_u[:, inter:]
        w = (weights * sel)[rows].sum(-1, keepdim=True)
        out[rows] += w * (act @ w2[e].t())
    return out


def run(s, cfg, steps):
    m = cfg["model"]
    assert cfg.get("refit", {}).get("precision", "bf16") == "bf16", \
        "this engine reads bfloat16 experts (refit.precision bf16)"
    runtime = {n: torch.zeros(shape, dtype=torch.bfloat16 if dt == torch.bfloat16 else torch.uint8)
               for n, shape, dt in s.expected()}
    s.register_all(runtime)
    x = probe(cfg)
    for version in range(1, steps + 1):
        s.begin(version)
        served = 0
        while not s.progress():
            moe_block(runtime, served % m["num_layers"], x, m)  # serving version - 1
            served += 1
        s.commit()  # the safe point: the next forward reads version `version`
        times = s.last_times()
        want = s.comm.recv(source=0, tag=version)
        got = moe_block(runtime, 0, x, m)
        diff = (got - want).abs().max().item()
        print("engine rank %d: version %d, %d serving steps during the refit, refit %.4f s "
              "(transfer %.4f, land %.4f, commit %.4f), MoE block vs trainer: max |diff| %.2e"
              % (s.comm.rank, version, served, times["total"], times["transfer"], times["land"],
                 times["commit"], diff), flush=True)
        if diff > 1e-4:
            raise SystemExit("engine: the MoE block differs from the trainer's")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--join", metavar="PORT_FILE")
    args = ap.parse_args()
    cfg = yaml.safe_load(open(args.config))
    join = {"side": "generator", "port_file": args.join} if args.join else None
    with refit.Session(args.config, join=join) as s:
        run(s, cfg, args.steps)


if __name__ == "__main__":
    main()

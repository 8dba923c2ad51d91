#!/usr/bin/env python3
"""Predicted refit time against its floor over generated layouts.

    launch/plan_sweep.py [--refit-plan build/runtime/refit-plan] [--count 24]
                         [--seed 1] [--link-gbps 50] [--markdown]

Draws `count` layouts (trainer tp, pp with uneven first and last stages,
ep, etp, dp; generator tp, ep and engines; BF16, MXFP8 and prequantized
MXFP8) of three models, DeepSeek-V3 (its real architecture), Qwen3-235B-A22B
and a Qwen3-32B-sized dense model, at the default refit.arena_bytes and bucket_bytes 1 GiB, runs
`refit-plan` on each, and prints the floor, the prediction, their ratio,
the schedule spread and the planning time, wall and CPU (the whole
refit-plan process's user + system seconds: what a shared machine does not
inflate): the benchmark of issue 41 (every layout within 1.2x of its floor,
planned within 5 s). Layouts the config
refuses are redrawn; the seed makes the sweep the same on every run.
"""

import argparse
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODELS = {
    # DeepSeek-V3's architecture (configs/deepseek-v3.yaml): MLA, 3 dense
    # layers, 256 routed experts and a shared one, the FP32 router bias.
    "deepseek-v3": dict(family="deepseek_v3", hidden_size=7168, num_layers=61,
                        num_attention_heads=128, num_kv_heads=128, head_dim=64,
                        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                        v_head_dim=128, intermediate_size=18432, num_experts=256,
                        moe_intermediate_size=2048, num_shared_experts=1,
                        first_k_dense_replace=3, moe_layer_freq=1, expert_bias="true",
                        vocab_size=129280),
    "qwen3-235b": dict(family="qwen3_moe", hidden_size=4096, num_layers=94,
                       num_attention_heads=64, num_kv_heads=4, head_dim=128,
                       vocab_size=151936, num_experts=128, moe_intermediate_size=1536),
    "dense-32b": dict(family="qwen3", hidden_size=5120, num_layers=64,
                      num_attention_heads=64, num_kv_heads=8, head_dim=128,
                      vocab_size=151936, intermediate_size=25600),
}
# MLA's W_UK_T / W_UV are views of a BF16 kv_b_proj only: an MXFP8 refit
# of DeepSeek keeps it BF16 (configs/deepseek-v3.yaml).
QUANTIZATION_IGNORE = {"deepseek-v3": "[lm_head, self_attn.kv_b_proj]"}


def stages(rng, layers, pp):
    """Stage sizes Megatron accepts: pp equal stages, or a first and/or last
    stage of its own size with the middle ones equal."""
    if pp == 1:
        return {}
    options = []
    for first in range(1, layers):
        for last in range(1, layers - first + 1):
            middle = layers - first - last
            if pp == 2 and middle == 0 or pp > 2 and middle > 0 and middle % (pp - 2) == 0:
                options.append((first, last))
    even = layers % pp == 0
    if even and rng.random() < 0.4:
        return {}
    first, last = rng.choice(options)
    return {"first_stage_layers": first, "last_stage_layers": last}


def draw(rng):
    name = rng.choice(["deepseek-v3", "deepseek-v3", "qwen3-235b", "dense-32b"])
    m = MODELS[name]
    t = {"tp": rng.choice([1, 2, 4, 8]), "pp": rng.choice([1, 2, 4, 8, 16]),
         "dp": rng.choice([1, 2, 4])}
    if "num_experts" in m:
        # Expert parallel folding: etp * ep divides tp * dp.
        fold = t["tp"] * t["dp"]
        pairs = [(ep, etp) for ep in (1, 2, 4, 8, 16, 32) for etp in (1, 2, 4, 8)
                 if fold % (ep * etp) == 0 and etp <= t["tp"]]
        t["ep"], t["etp"] = rng.choice(pairs)
    t.update(stages(rng, m["num_layers"], t["pp"]))
    g = {"tp": rng.choice([1, 2, 4, 8, 16]), "engines": rng.choice([1, 2, 4, 8])}
    if "num_experts" in m and rng.random() < 0.7:
        g["ep"] = g["tp"]
    precision = rng.choice(["bf16", "mxfp8", "mxfp8-prequantized"])
    return name, t, g, precision


def yaml_of(name, t, g, precision):
    lines = ["model:"] + ["  %s: %s" % kv for kv in MODELS[name].items()]
    lines += ["trainer:"] + ["  %s: %s" % kv for kv in t.items()]
    lines += ["generator:"] + ["  %s: %s" % kv for kv in g.items()]
    lines += ["refit:", "  bucket_bytes: 1GiB",
              "  precision: %s" % ("bf16" if precision == "bf16" else "mxfp8")]
    if precision.endswith("prequantized"):
        lines.append("  prequantize: true")
    if precision != "bf16" and name in QUANTIZATION_IGNORE:
        lines.append("  quantization_ignore: %s" % QUANTIZATION_IGNORE[name])
    return "\n".join(lines) + "\n"


def field(text, key):
    m = re.search(r"^\s*%s\s+([0-9.]+)" % re.escape(key), text, re.M)
    return float(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--refit-plan", default=os.path.join(ROOT, "build", "runtime", "refit-plan"))
    ap.add_argument("--count", type=int, default=24)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--link-gbps", default="50")
    ap.add_argument("--max-tries", type=int, default=2000)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    rows, refused, tries, arena = [], 0, 0, []
    with tempfile.TemporaryDirectory(prefix="refit-sweep.") as tmp:
        cfg = os.path.join(tmp, "layout.yaml")
        while len(rows) + len(arena) < args.count and tries < args.max_tries:
            tries += 1
            name, t, g, precision = draw(rng)
            with open(cfg, "w") as f:
                f.write(yaml_of(name, t, g, precision))
            start = time.time()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            p = subprocess.run([args.refit_plan, cfg, "--link-gbps", args.link_gbps],
                               capture_output=True, text=True)
            wall = time.time() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            if p.returncode != 0:
                # The config rules refuse what Megatron or vLLM would (drawn
                # again); the planner refusing a valid layout for memory is
                # a result of the sweep.
                if "arena_bytes" in p.stderr:
                    arena.append("%s %s -> %s %s" % (name, t, g, precision))
                else:
                    refused += 1
                continue
            floor, pred = field(p.stdout, "floor"), field(p.stdout, "predicted")
            if not floor or pred is None:
                sys.exit("refit-plan printed no floor/prediction for:\n%s\n%s"
                         % (yaml_of(name, t, g, precision), p.stdout + p.stderr))
            rows.append(dict(
                model=name, precision=precision,
                trainer=" ".join("%s%s" % (k.replace("_stage_layers", ""), v)
                                 for k, v in t.items()),
                generator=" ".join("%s%s" % kv for kv in g.items()),
                floor=floor, pred=pred, ratio=pred / floor,
                spread=field(p.stdout, "schedule spread"),
                planned=field(p.stdout, "planned in"), wall=wall, cpu=cpu))
    print("| model | precision | trainer | generator | floor s | predicted s | ratio | "
          "spread | planned s | refit-plan CPU s |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print("| %(model)s | %(precision)s | %(trainer)s | %(generator)s | %(floor).4f | "
              "%(pred).4f | %(ratio).3f | %(spread).3f | %(planned).2f | %(cpu).2f |" % r)
    for a in arena:
        print("| planner refused (refit.arena_bytes) | %s |" % a)
    if not rows:
        sys.exit("no layout planned (%d refused)" % refused)
    worst = max(rows, key=lambda r: r["ratio"])
    slow = max(rows, key=lambda r: r["planned"])
    slow_cpu = max(rows, key=lambda r: r["cpu"])
    print("\n%d layouts (%d drawn layouts refused by the config rules); worst ratio %.3f "
          "(%s, %s -> %s, %s); %d over 1.2x; slowest plan %.2f s wall, %.2f s CPU "
          "(the most refit-plan CPU seconds of one layout)"
          % (len(rows), refused, worst["ratio"], worst["model"], worst["trainer"],
             worst["generator"], worst["precision"], sum(r["ratio"] > 1.2 for r in rows),
             slow["planned"], slow_cpu["cpu"]))
    print("%d valid layouts the planner refused for want of refit.arena_bytes" % len(arena))


if __name__ == "__main__":
    main()

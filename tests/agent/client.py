"""One framework process attached to a refit agent, as a torchrun trainer
rank or a vLLM worker is: plain Python, no MPI (tests/agent/test_agent.py
starts it with subprocess).

    client.py trainer|generator RANK CONFIG SOCKET_DIR [--versions 1,2,3]
              [--die-in-refit V] [--shutdown] [--gate V FILE] [--expect-fail V,..]

A trainer registers its Megatron-Core tensors (tests/caller/megatron_rules.py
applied to torch-made weights of each version) and refits each version; an
engine registers torch runtime tensors under vLLM's names, takes each refit
the trainers begin and compares every byte with tests/reference/vllm_rules.py.
Prints one line per committed version ("committed V") and exits 0 only when
every step did what it should.
"""

import argparse
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests", "python")]

import numpy as np  # noqa: E402
import torch  # noqa: E402

import refit  # noqa: E402
from refit_testlib import compare, from_bits, full_weights, torch_like, vllm_rules  # noqa: E402
import megatron_rules  # noqa: E402
import yaml  # noqa: E402

SEED = 4242

ap = argparse.ArgumentParser()
ap.add_argument("side")
ap.add_argument("rank", type=int)
ap.add_argument("config")
ap.add_argument("socket_dir")
ap.add_argument("--versions", default="1,2,3")
ap.add_argument("--die-in-refit", type=int, default=0,
                help="SIGKILL this process in the middle of refitting this version")
ap.add_argument("--shutdown", action="store_true", help="stop the agents at the end")
ap.add_argument("--swap-at", type=int, default=0,
                help="trainer: give every tensor new storage before this version (as "
                     "model.float(); model.bfloat16() does)")
ap.add_argument("--gate", nargs=2, metavar=("V", "FILE"), default=None,
                help="before version V, wait until FILE exists (the test creates it once "
                     "a restarted process has attached)")
ap.add_argument("--expect-fail", default="",
                help="versions whose refit must fail (comma-separated)")
args = ap.parse_args()
versions = [int(v) for v in args.versions.split(",") if v]
expect_fail = {int(v) for v in args.expect_fail.split(",") if v}
cfg = yaml.safe_load(open(args.config))
assert "mpi4py" not in sys.modules

c = refit.attach(args.side, args.rank, socket_dir=args.socket_dir)
assert "mpi4py" not in sys.modules and "refit._lib" not in sys.modules
print("attached %s %d pid %d" % (c.side, c.rank, os.getpid()), flush=True)
# A GPU rank's agent takes CUDA tensors of its GPU (the one machine's GPU 0
# here); a host rank's, CPU tensors.
device = torch.device("cuda", 0) if c.memory == "cuda" else torch.device("cpu")

if args.side == "trainer":
    rng = np.random.default_rng([SEED, args.rank])
    tensors = megatron_rules.trainer_tensors(cfg, full_weights(cfg, SEED, 1), args.rank, rng)
    model = {n: from_bits(a).to(device) for n, a in tensors.items()}
    assert sorted(model) == sorted(n for n, _, _ in c.expected())
    if cfg["model"]["family"] == "deepseek_v3":
        # The trainer's multi-token-prediction layer (Megatron-Core
        # mtp.layers.*): the agent takes it and refits nothing of it.
        mtp = cfg["trainer"].get("name_prefix", "") + "mtp.layers.0.enorm.weight"
        model[mtp] = torch.ones(cfg["model"]["hidden_size"], dtype=torch.bfloat16,
                                device=device)
    c.register_all(model)
else:
    held = {n: torch_like(shape, dt).to(device) for n, shape, dt in c.expected()}
    c.register_all(held)

for version in versions:
    if args.gate and version == int(args.gate[0]):
        deadline = time.time() + 300
        while not os.path.exists(args.gate[1]):
            assert time.time() < deadline, "gate %s never opened" % args.gate[1]
            time.sleep(0.05)
    if args.side == "trainer" and version == args.swap_at:
        for t in model.values():
            t.set_(t.clone())  # new storage: the client registers it again at begin
    if args.side == "trainer":
        new = megatron_rules.trainer_tensors(cfg, full_weights(cfg, SEED, version), args.rank,
                                             rng)
        for n, t in model.items():
            t.copy_(from_bits(new[n]).reshape(t.shape))  # in place: the agent reads it
        if device.type == "cuda":
            torch.cuda.synchronize()
    if version == args.die_in_refit:
        # Die while the refit is in flight: begin, one bucket, then SIGKILL.
        if args.side == "trainer":
            c.begin(version)
        else:
            c.begin(c.next_version())
        c.progress()
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        if args.side == "trainer":
            c.refit(version)
        else:
            got = c.refit()
    except refit.AgentError as e:
        if version in expect_fail:
            print("failed %d as expected: %s" % (version, e), flush=True)
            continue
        raise
    assert version not in expect_fail, "version %d should have failed" % version
    assert c.committed_version == version, (c.committed_version, version)
    if args.side == "generator":
        want = vllm_rules.runtime_tensors(cfg, full_weights(cfg, SEED, version), c.tp_rank)
        assert sorted(want) == sorted(held)
        for n, w in want.items():
            compare(held[n], w, "version %d %s" % (version, n))
    print("committed %d %s" % (version, sorted(c.last_times)), flush=True)

if args.shutdown:
    c.shutdown()
c.close()
print("done", flush=True)

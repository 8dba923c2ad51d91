"""One side of two separately launched jobs (refit.Session(..., join=...)).

    join_job.py SIDE CONFIG PORT_FILE TIMEOUT_S [--expect-timeout]

Both sides refit 3 versions over the merged communicator: the trainer from
torch tensors under Hugging Face names, the generators into torch tensors
they registered, compared with vLLM's rules. With --expect-timeout the other
side never comes: refit.TimeoutError naming the port file is the pass.
"""

import sys
import time

import torch

import refit
from refit_testlib import NamedModel, compare, from_bits, full_weights, torch_like, vllm_rules

side, path, port_file, timeout_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
import yaml  # noqa: E402

cfg = yaml.safe_load(open(path))
if "--expect-timeout" in sys.argv:
    t0 = time.monotonic()
    try:
        refit.Session(path, join={"side": side, "port_file": port_file, "timeout_s": timeout_s})
    except refit.TimeoutError as e:
        took = time.monotonic() - t0
        assert port_file in e.message and took < timeout_s + 10, (e.message, took)
        print("join_job: %s: timed out as expected after %.1f s: %s" % (side, took, e.message))
        print("join_job: passed")
        sys.exit(0)
    sys.exit("join_job: %s: no timeout" % side)

with refit.Session(path, join={"side": side, "port_file": port_file,
                               "timeout_s": timeout_s}) as s:
    assert s.side == side, (s.side, side)
    rank = refit.session.MPI.COMM_WORLD.rank  # this launch's own rank
    held = {}
    if side == "trainer":
        model = NamedModel({n: from_bits(a) for n, a in full_weights(cfg, 5, 1).items()})
        s.register_all(model.named_parameters())
    else:
        held = {n: torch_like(shape, dt) for n, shape, dt in s.expected()}
        s.register_all(held)
    for version in (1, 2, 3):
        full = full_weights(cfg, 5, version)
        if side == "trainer":
            with torch.no_grad():
                for n, p in model.named_parameters():
                    p.copy_(from_bits(full[n]))
        times = s.refit(version)
        if side == "generator":
            tp = cfg.get("generator", {}).get("tp", 1)
            for n, w in vllm_rules.runtime_tensors(cfg, full, rank % tp).items():
                compare(held[n], w, "version %d %s" % (version, n))
        print("join_job: %s rank %d: version %d refitted in %.4f s" % (side, rank, version,
                                                                      times["total"]))
print("join_job: passed")

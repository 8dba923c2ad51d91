"""One side of two separately launched jobs (refit.Session(..., join=...)).

    join_job.py SIDE CONFIG PORT_FILE TIMEOUT_S [--expect-timeout |
                --expect-error TEXT | --intruder]

Both sides refit 3 versions over the merged communicator: the trainer from
torch tensors under Hugging Face names, the generators into torch tensors
they registered, compared with vLLM's rules. With --expect-timeout the other
side never comes: refit.TimeoutError naming the port file is the pass. With
--expect-error the join must fail within the timeout with a refit.Error whose
message holds TEXT and the port file. --intruder is no refit job: it claims
the port file, connects and sends the hello of refit's first protocol (which
made it the trainers' rank 0), then tries to merge; it prints "merged" only
if a generator let it in.
"""

import os
import sys
import time

import yaml

import refit

side, path, port_file, timeout_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])

cfg = yaml.safe_load(open(path))
if "--intruder" in sys.argv:
    import numpy as np
    from mpi4py import MPI

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.rename(port_file, port_file + ".stolen")
            break
        except FileNotFoundError:
            if time.monotonic() > deadline:
                sys.exit("join_job: intruder: no port file")
            time.sleep(0.05)
    port = open(port_file + ".stolen").readline().strip()
    inter = MPI.COMM_WORLD.Connect(port)
    inter.Send(np.array([0x72656674], dtype=np.int32), dest=0, tag=7711)
    print("join_job: intruder: connected and sent the hello", flush=True)
    merged = inter.Merge(False)  # only with a generator that let it in
    print("join_job: intruder: merged as rank %d of %d" % (merged.rank, merged.size), flush=True)
    sys.exit(0)
if "--expect-error" in sys.argv:
    text = sys.argv[sys.argv.index("--expect-error") + 1]
    t0 = time.monotonic()
    try:
        refit.Session(path, join={"side": side, "port_file": port_file, "timeout_s": timeout_s})
    except refit.Error as e:
        took = time.monotonic() - t0
        # Rank 0 says why; the job's other ranks point at rank 0.
        said = text in e.message or (refit.session.MPI.COMM_WORLD.rank != 0 and
                                     "rank 0 could not" in e.message)
        assert said and port_file in e.message and took < timeout_s + 10, (e.message, took)
        print("join_job: %s: refused as expected after %.1f s: %s" % (side, took, e.message))
        print("join_job: passed")
        sys.exit(0)
    sys.exit("join_job: %s: joined, expected an error saying %r" % (side, text))
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

# Only the refits use torch: the runs above, which never get that far (7 of
# run_join.sh's 9 launches), skip its import (2 s of CPU in every rank).
import torch  # noqa: E402

from refit_testlib import (NamedModel, compare, from_bits, full_weights,  # noqa: E402
                           torch_like, vllm_rules)

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

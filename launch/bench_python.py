"""The refit benchmark through Python: torch tensors from PyTorch's caching
allocator on both sides, timed as refit-run times (refit_s: the slowest
rank's begin-to-commit less the slowest source, median of the refits after
the first).

    launch/refit-launch CONFIG -- python3 launch/bench_python.py CONFIG [--caller]

Every rank registers torch tensors of its own (on its GPU where it has one:
torch.empty, so pointers inside the allocator's larger blocks) for every
tensor refit expects. Without --caller the config's source (synthetic)
fills the trainer's tensors inside each refit, as refit-run does, and the
first refit is verified; with --caller the config must say source.kind
caller: the trainer's tensors are filled once with random bits and sent as
they are. Rank 0 prints one line:

    bench_python: CONFIG source S: median refit T s over N refits (first F s)
"""

import argparse
import os
import statistics
import sys

import torch
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import refit  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float8_e4m3fn": torch.uint8, "float8_e8m0fnu": torch.uint8}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--caller", action="store_true")
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    s = refit.Session(args.config)
    dev = s.device if s.device is not None and s.device >= 0 else None
    where = torch.device("cuda", dev) if dev is not None else torch.device("cpu")
    if dev is not None:
        torch.cuda.set_device(dev)
    held = {}
    for name, shape, dtype in s.expected():
        t = torch.empty(shape, dtype=DTYPES[refit.dtype_name(dtype)], device=where)
        if args.caller and s.side == "trainer":
            t.view(torch.int16).random_(-(1 << 15), 1 << 15)
            # Finite bfloat16 only: clear the exponent's top bit.
            t.view(torch.int16).bitwise_and_(0x3FFF)
        held[name] = t
    s.register_all(held)
    times = []
    first = None
    for version in range(1, args.steps + 1):
        comm.Barrier()
        s.refit(version)
        # refit-run's refit_s: the slowest rank's begin to the end of commit
        # less the slowest rank's producing of the weights (the training
        # step's job).
        t = s.last_times()
        dt = comm.allreduce(t["total"], op=MPI.MAX) - comm.allreduce(t["source"], op=MPI.MAX)
        if version == 1:
            first = dt
            if not args.caller and s.verify(version) != 0:
                print("bench_python: rank %d: version 1 does not verify" % comm.rank, flush=True)
                comm.Abort(1)
        else:
            times.append(dt)
    if comm.rank == 0:
        print("bench_python: %s source %s: median refit %.4f s over %d refits (first %.3f s)%s" % (
            os.path.basename(args.config), "caller" if args.caller else "synthetic",
            statistics.median(times), len(times), first,
            "" if args.caller else ", version 1 verified"), flush=True)
    s.close()


if __name__ == "__main__":
    main()

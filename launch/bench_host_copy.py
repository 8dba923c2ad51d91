"""The memory copy rate a refit's prediction charges its passes at
(`refit-plan --copy-gbps`): numpy copies of bucket-sized buffers on every
rank of the job, all at once, measured in the same job as the refit.

    launch/refit-launch CONFIG -- python3 launch/bench_host_copy.py [--mib N]

Every rank copies N MiB (default: the config's refit.bucket_bytes, else 64)
from one buffer into another, 5 times after one warm-up; each copy starts on
every rank together (a barrier) and each rank times its own. Rank 0 prints
the median over ranks and repeats of bytes copied / time, the figure to pass
to `refit-plan --copy-gbps`:

    bench_host_copy: N ranks at once: per-rank copy X GB/s; one rank alone: Y GB/s

"One rank alone" is rank 0 copying while the others sleep (not spin): the
rate of a pass that runs while the rest of the job waits.
"""

import argparse
import time

import numpy as np
import yaml
from mpi4py import MPI


def quiet_barrier(comm):
    """A barrier whose waiters sleep between polls, leaving the cores to the
    rank that works (MPI's own barrier spins)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.0005)


def copy_s(dst, src):
    t0 = time.perf_counter()
    np.copyto(dst, src)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config", nargs="?")
    ap.add_argument("--mib", type=int, default=0)
    args = ap.parse_args()
    mib = args.mib
    if mib == 0 and args.config:
        with open(args.config) as f:
            refit = (yaml.safe_load(f) or {}).get("refit", {}) or {}
        text = str(refit.get("bucket_bytes", "64MiB"))
        units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
        unit = next((u for u in units if text.endswith(u)), None)
        nbytes = int(text[: -len(unit)]) * units[unit] if unit else int(text)
        mib = max(1, nbytes >> 20)
    mib = mib or 64
    comm = MPI.COMM_WORLD
    n = mib << 20
    src = np.random.default_rng(comm.rank).integers(0, 256, n, dtype=np.uint8)
    dst = np.empty(n, np.uint8)
    np.copyto(dst, src)  # fault the pages in
    together = []
    for it in range(6):
        quiet_barrier(comm)
        dt = copy_s(dst, src)
        if it > 0:
            together.append(n / dt / 1e9)
    alone = []
    for it in range(6):
        quiet_barrier(comm)
        if comm.rank == 0:
            dt = copy_s(dst, src)
            if it > 0:
                alone.append(n / dt / 1e9)
    rates = comm.gather(together, root=0)
    if comm.rank == 0:
        every = [r for per_rank in rates for r in per_rank]
        print("bench_host_copy: %d ranks at once: per-rank copy %.3f GB/s; one rank "
              "alone: %.3f GB/s (medians of %d MiB copies)"
              % (comm.size, float(np.median(every)), float(np.median(alone)), mib),
              flush=True)
    quiet_barrier(comm)


if __name__ == "__main__":
    main()

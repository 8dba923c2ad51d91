"""The host "link" a refit's prediction is checked against: plain MPI
messages between the same ranks, in the same pattern as a refit (every
trainer sends to every generator at once), measured in the same job.

    launch/refit-launch CONFIG -- python3 launch/bench_host_link.py CONFIG [--mib N]

CONFIG gives the job's ranks (trainer tp * pp * dp first, generators after).
Each trainer sends N MiB (default 256) to every generator, all messages in
flight together, 5 times after one warm-up; rank 0 prints the busiest
generator's ingress rate, the number to pass to `refit-plan --link-gbps`:

    bench_host_link: T trainers -> G generators: per-generator ingress X GB/s
"""

import argparse
import sys

import numpy as np
import yaml
from mpi4py import MPI


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--mib", type=int, default=256)
    args = ap.parse_args()
    with open(args.config) as f:
        cfg = yaml.safe_load(f)
    t = cfg.get("trainer", {})
    g = cfg.get("generator", {})
    ntrainer = t.get("tp", 1) * t.get("pp", 1) * t.get("dp", 1)
    ngen = g.get("tp", 1) * g.get("engines", 1)
    comm = MPI.COMM_WORLD
    if comm.size != ntrainer + ngen:
        sys.exit("bench_host_link: %d ranks, the config has %d" % (comm.size, ntrainer + ngen))
    n = args.mib << 20
    rng = np.random.default_rng(comm.rank)
    if comm.rank < ntrainer:
        bufs = [rng.integers(0, 256, n, dtype=np.uint8) for _ in range(ngen)]
    else:
        bufs = [np.empty(n, np.uint8) for _ in range(ntrainer)]
    times = []
    for it in range(6):
        comm.Barrier()
        t0 = MPI.Wtime()
        if comm.rank < ntrainer:
            reqs = [comm.Isend(bufs[k], dest=ntrainer + k, tag=it) for k in range(ngen)]
        else:
            reqs = [comm.Irecv(bufs[k], source=k, tag=it) for k in range(ntrainer)]
        MPI.Request.Waitall(reqs)
        dt = MPI.Wtime() - t0
        slowest = comm.allreduce(dt, op=MPI.MAX)
        if it > 0:
            times.append(slowest)
    if comm.rank == 0:
        ingress = ntrainer * n / float(np.median(times)) / 1e9
        print("bench_host_link: %d trainers -> %d generators: per-generator ingress "
              "%.3f GB/s (median of %d rounds of %d MiB per pair)"
              % (ntrainer, ngen, ingress, len(times), args.mib), flush=True)


if __name__ == "__main__":
    main()

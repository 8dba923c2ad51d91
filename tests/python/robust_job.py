"""A refit job that goes wrong on purpose, for test_errors.py. Every rank:
    robust_job.py CONFIG raise    rank 0 raises before the first begin; the
                                  others wait in their first refit
    robust_job.py CONFIG sigint   rank 0 gets SIGINT 2 s into its begin,
                                  which cannot complete yet: the last rank
                                  calls it 5 s late
Prints "interrupted after S s" where rank 0's wait ended."""

import os
import signal
import sys
import threading
import time

from mpi4py import MPI

import refit

path, mode = sys.argv[1], sys.argv[2]
rank, size = MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size
s = refit.Session(path)
if s.side == "generator":
    # The engine's torch tensors: torch is imported where it is used, not
    # on the trainer, which registers nothing (2 s of CPU a rank).
    from refit_testlib import torch_like
    s.register_all({n: torch_like(shape, dt) for n, shape, dt in s.expected()})
if mode == "raise":
    if rank == 0:
        raise RuntimeError("rank 0 fails before its first begin")
    s.refit(1)
elif mode == "sigint":
    if rank == size - 1:
        time.sleep(5)  # then begins, when rank 0 has ended
    if rank == 0:
        threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        s.begin(1)
    except KeyboardInterrupt:
        print("interrupted after %.1f s" % (time.monotonic() - t0), flush=True)
        raise

#!/usr/bin/env python3
"""The PCIe ceiling for docs/benchmarks.md: copy bandwidth between pinned
host memory and the GPU (cudaMemcpyAsync through torch), each way and both
ways at once, for one buffer of the size given (default 1666 MiB: a
trainer's delta baseline in launch/bench-gpu.sh's 3.32 GiB run).

    python3 launch/bench_pcie.py [MiB] [repeats]

Prints GB/s (10^9 bytes a second), the best of the repeats, timed with CUDA
events; the copy is checked once (the bytes back equal the bytes sent).
"""
import sys

import torch


def best(fn, reps):
    times = []
    for _ in range(reps):
        t0 = torch.cuda.Event(enable_timing=True)
        t1 = torch.cuda.Event(enable_timing=True)
        t0.record()
        fn()
        t1.record()
        t1.synchronize()
        times.append(t0.elapsed_time(t1) / 1e3)
    return min(times)


def main():
    mib = float(sys.argv[1]) if len(sys.argv) > 1 else 1666.0
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    if not torch.cuda.is_available():
        sys.exit("bench_pcie: no CUDA device")
    n = int(mib * 2**20)
    host = torch.randint(0, 256, (n,), dtype=torch.uint8).pin_memory()
    back = torch.empty(n, dtype=torch.uint8).pin_memory()
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    dev2 = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
    dev.copy_(host, non_blocking=True)
    back.copy_(dev, non_blocking=True)
    torch.cuda.synchronize()
    if not torch.equal(host, back):
        sys.exit("bench_pcie: the bytes back differ from the bytes sent")
    h2d = best(lambda: dev.copy_(host, non_blocking=True), reps)
    d2h = best(lambda: back.copy_(dev, non_blocking=True), reps)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def both():
        cur = torch.cuda.current_stream()
        s1.wait_stream(cur)
        s2.wait_stream(cur)
        with torch.cuda.stream(s1):
            dev.copy_(host, non_blocking=True)
        with torch.cuda.stream(s2):
            back.copy_(dev2, non_blocking=True)
        cur.wait_stream(s1)
        cur.wait_stream(s2)

    duplex = best(both, reps)
    print("bench_pcie: %s, %.1f MiB pinned, best of %d" %
          (torch.cuda.get_device_name(), mib, reps))
    print("host -> GPU %.1f GB/s, GPU -> host %.1f GB/s, both at once %.1f GB/s in all" %
          (n / h2d / 1e9, n / d2h / 1e9, 2 * n / duplex / 1e9))


if __name__ == "__main__":
    main()

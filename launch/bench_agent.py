"""Refit through agents against the in-process session, on the same config.

    python3 launch/bench_agent.py CONFIG [--build-dir B] [--steps N]

Runs CONFIG (source.kind caller, one trainer and one generator rank) twice:

- in-process: the trainer and the engine are ranks of one MPI job
  (refit.Session, launch/bench_agent.py --inproc under refit-launch);
- through agents: refit-agent ranks launched by refit-launch, and a trainer
  and an engine process started as plain subprocesses attached to them
  (refit.attach; no MPI in either).

Both register torch tensors of their own (on the GPU where there is one:
torch.empty, so pointers inside the caching allocator's blocks); the
trainer's hold random finite bfloat16 bits. The time of a refit is the
trainer's wall time of its refit call (begin, progress, commit), median of
the refits after the first. Prints one line per path and their ratio:

    bench_agent: CONFIG in-process: median T s over N refits (first F s)
    bench_agent: CONFIG agents: median T s over N refits (first F s), agent total A s
    bench_agent: CONFIG agents / in-process: R
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

DTYPES = {"bfloat16": "bfloat16", "float8_e4m3fn": "uint8", "float8_e8m0fnu": "uint8"}


def tensors(expected, trainer, cuda):
    import torch
    import refit
    where = torch.device("cuda", 0) if cuda else torch.device("cpu")
    held = {}
    for name, shape, dtype in expected:
        t = torch.empty(shape, dtype=getattr(torch, DTYPES[refit.dtype_name(dtype)]),
                        device=where)
        if trainer:
            t.view(torch.int16).random_(-(1 << 15), 1 << 15)
            t.view(torch.int16).bitwise_and_(0x3FFF)  # finite bfloat16 only
        held[name] = t
    if cuda:
        torch.cuda.synchronize()
    return held


def report(what, times, extra=""):
    med = statistics.median(times[1:])
    print("bench_agent: %s: median %.4f s over %d refits (first %.3f s)%s"
          % (what, med, len(times) - 1, times[0], extra), flush=True)
    return med


def inproc(args):
    import torch
    from mpi4py import MPI
    import refit
    comm = MPI.COMM_WORLD
    s = refit.Session(args.config)
    cuda = s.device is not None and s.device >= 0
    if cuda:
        torch.cuda.set_device(s.device)
    s.register_all(tensors(s.expected(), s.side == "trainer", cuda))
    times = []
    for version in range(1, args.steps + 1):
        comm.Barrier()
        t = time.perf_counter()
        s.refit(version)
        times.append(time.perf_counter() - t)
    if s.side == "trainer":
        report("%s in-process" % os.path.basename(args.config), times)
    s.close()


def client(args):
    import torch
    import refit
    c = refit.attach(args.client, 0, socket_dir=args.socket_dir)
    cuda = c.memory == "cuda"
    held = tensors(c.expected(), c.side == "trainer", cuda)
    c.register_all(held)
    times, totals = [], []
    for version in range(1, args.steps + 1):
        t = time.perf_counter()
        if c.side == "trainer":
            c.refit(version)
        else:
            c.refit()
        if cuda:
            torch.cuda.current_stream().synchronize()
        times.append(time.perf_counter() - t)
        totals.append(c.last_times["total"])
    if c.side == "trainer":
        report("%s agents" % os.path.basename(args.config), times,
               ", agent total %.4f s" % statistics.median(totals[1:]))
        c.shutdown()
    c.close()


def driver(args):
    launch = os.path.join(ROOT, "launch", "refit-launch")
    cfg = os.path.abspath(args.config)
    env = dict(os.environ)
    env["REFIT_LIBRARY"] = os.path.join(args.build_dir, "runtime", "librefit.so")
    out = subprocess.run([launch, "--build-dir", args.build_dir, cfg, "--", sys.executable,
                          os.path.abspath(__file__), cfg, "--inproc", "--steps",
                          str(args.steps)], env=env, capture_output=True, text=True)
    lines = [x for x in out.stdout.splitlines() if x.startswith("bench_agent")]
    if out.returncode != 0 or not lines:
        sys.exit("bench_agent: the in-process run failed (%d):\n%s%s"
                 % (out.returncode, out.stdout[-4000:], out.stderr[-4000:]))
    print(lines[0], flush=True)
    inproc_s = float(lines[0].split("median ")[1].split(" s")[0])
    with tempfile.TemporaryDirectory(prefix="refit-bench-agent.") as d:
        sock = os.path.join(d, "s")
        agents = subprocess.Popen([launch, "--build-dir", args.build_dir, cfg, "--",
                                   os.path.join(args.build_dir, "runtime", "refit-agent"),
                                   "--socket-dir", sock, cfg],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        while not os.path.exists(os.path.join(sock, "ready")):
            if agents.poll() is not None:
                sys.exit("bench_agent: the agents exited:\n" + agents.stdout.read())
            time.sleep(0.1)
        plain = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), cfg, "--client",
                                   side, "--socket-dir", sock, "--steps", str(args.steps)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=plain)
                 for side in ("generator", "trainer")]
        outs = [p.communicate(timeout=600)[0] for p in procs]
        agents.wait(60)
        if any(p.returncode for p in procs) or agents.returncode:
            sys.exit("bench_agent: the agent run failed:\n%s\n%s\n%s"
                     % (outs[0][-3000:], outs[1][-3000:], agents.stdout.read()[-3000:]))
        line = [x for x in outs[1].splitlines() if x.startswith("bench_agent")][0]
        print(line, flush=True)
        agent_s = float(line.split("median ")[1].split(" s")[0])
    print("bench_agent: %s agents / in-process: %.3f" % (os.path.basename(cfg),
                                                          agent_s / inproc_s), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--inproc", action="store_true")
    ap.add_argument("--client", choices=("trainer", "generator"))
    ap.add_argument("--socket-dir")
    args = ap.parse_args()
    args.build_dir = os.path.abspath(args.build_dir)
    if args.inproc:
        inproc(args)
    elif args.client:
        client(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()

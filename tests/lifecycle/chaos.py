#!/usr/bin/env python3
"""Chaos test: kill a random rank of a long multi-refit job from outside.

    chaos.py BUILD CONFIG --transport T [--kills N] [--seed S]
             [--max-delay SECONDS] [--exit-bound SECONDS]

No fault seam: each run starts CONFIG (a long run of small refits) with
launch/refit-launch and refit-run --status-dir, waits until every rank has
opened its session, sleeps a random time, and SIGKILLs a random rank. Then:

  - every surviving rank exits within the exit bound of the kill (no hang;
    a hung job's ranks get a gdb backtrace each, and the job is killed),
  - every survivor writes a status file naming the phase it failed in and
    the error (the run is far too long to end on its own),
  - every generator's runtime storage verifies bit for bit against its
    committed version, or the generator says POISONED,
  - the tensor-parallel ranks of one engine agree on that version (an
    engine whose ranks are not POISONED serves one version), and ranks of
    the same tp rank in different engines holding one version hold the same
    bytes (digest),
  - no sanitizer report.

The randomness is seeded (--seed, else $REFIT_CHAOS_SEED, else a fresh
one); the seed is printed first and repeats the victims and delays.
"""
import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read_status(path):
    """key=value lines of a status file, or None while it is incomplete."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    if not lines or lines[-1] != "end":
        return None
    return dict(line.split("=", 1) for line in lines[:-1] if "=" in line)


def backtraces(pids):
    out = []
    for rank, pid in sorted(pids.items()):
        try:
            r = subprocess.run(
                ["gdb", "-p", str(pid), "-batch", "-ex", "bt"],
                capture_output=True, text=True, timeout=20)
            frames = [l for l in r.stdout.splitlines() if l.startswith("#")]
            out.append("rank %d (pid %d):\n  %s" % (rank, pid, "\n  ".join(frames[:25])))
        except (OSError, subprocess.TimeoutExpired) as e:
            out.append("rank %d (pid %d): no backtrace (%s)" % (rank, pid, e))
    return "\n".join(out)


def one_run(args, config, run, rng, work):
    """One job killed at a random moment. Returns a list of failures."""
    status_dir = os.path.join(work, "status.%d" % run)
    os.mkdir(status_dir)
    log_path = os.path.join(work, "log.%d" % run)
    cmd = [os.path.join(ROOT, "launch", "refit-launch"), "--build-dir", args.build, config,
           "--", os.path.join(args.build, "runtime", "refit-run"), "--status-dir",
           status_dir, config]
    np = int(subprocess.check_output(
        [os.path.join(args.build, "runtime", "refit-plan"), "--world-size", config]))
    log = open(log_path, "w")
    job = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    failures = []
    pids, sides = {}, {}
    t0 = time.time()
    # Start-up: every rank's session is open when its pid file appears.
    while len(pids) < np and job.poll() is None and time.time() - t0 < args.startup_bound:
        for r in range(np):
            if r not in pids:
                try:
                    with open(os.path.join(status_dir, "rank.%d.pid" % r)) as f:
                        pid, side = f.read().split()
                    pids[r], sides[r] = int(pid), side
                except (OSError, ValueError):
                    pass
        time.sleep(0.02)
    if len(pids) < np:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        log.close()
        return ["start-up: %d of %d ranks opened their session in %.0f s (job %s)" %
                (len(pids), np, args.startup_bound,
                 "exited" if job.returncode is not None else "running")], log_path
    delay = rng.uniform(0.0, args.max_delay)
    victim = rng.randrange(np)
    time.sleep(delay)
    if job.poll() is not None:
        log.close()
        return ["the job ended before the kill (%.2f s in): the run is too short" % delay], log_path
    t_kill = time.time()
    os.kill(pids[victim], signal.SIGKILL)
    try:
        job.wait(timeout=args.exit_bound)
    except subprocess.TimeoutExpired:
        pass
    t_end = time.time()
    survivors = {r: p for r, p in pids.items() if r != victim}
    statuses = {r: read_status(os.path.join(status_dir, "rank.%d.status" % r))
                for r in survivors}
    if job.returncode is None:
        hung = {r: p for r, p in survivors.items() if statuses[r] is None}
        failures.append("HANG: ranks %s still running %.0f s after rank %d was killed\n%s" %
                        (sorted(hung), args.exit_bound, victim, backtraces(hung)))
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    log.close()
    with open(log_path) as f:
        text = f.read()
    if re.search(r"ERROR: AddressSanitizer|runtime error:", text):
        failures.append("a sanitizer reported an error (log below)")
    if job.returncode == 0:
        failures.append("the launcher reported success with rank %d killed" % victim)

    gens = {}
    slowest = 0.0
    for r, st in sorted(statuses.items()):
        if st is None:
            if job.returncode is not None or r not in pids:
                failures.append("rank %d wrote no status file" % r)
            continue
        slowest = max(slowest, float(st["time"]) - t_kill)
        if float(st["time"]) - t_kill > args.exit_bound:
            failures.append("rank %d exited %.1f s after the kill (bound %.0f s)" %
                            (r, float(st["time"]) - t_kill, args.exit_bound))
        if st["exit"] == "ok":
            failures.append("rank %d says every refit succeeded with rank %d killed" % (r, victim))
        elif st.get("phase", "none") == "none" or not st.get("error"):
            failures.append("rank %d failed without naming a phase and an error: %s" % (r, st))
        if st.get("side") == "generator":
            gens[r] = st
            v = st.get("verify", "")
            if not (v == "ok" or (st["state"] == "POISONED" and v.startswith("skipped")) or
                    (st["committed"] == "0" and v.startswith("skipped"))):
                failures.append("rank %d: runtime storage does not verify as version %s: %s" %
                                (r, st["committed"], v))
    # One engine, one version: its ranks that are not POISONED agree.
    engines = {}
    for r, st in gens.items():
        engines.setdefault(st["engine"], []).append((r, st))
    summary = []
    for e, ranks in sorted(engines.items()):
        versions = {st["committed"] for r, st in ranks if st["state"] != "POISONED"}
        poisoned = [r for r, st in ranks if st["state"] == "POISONED"]
        if len(versions) > 1:
            failures.append("engine %s is split: %s" % (
                e, ", ".join("rank %d at version %s (%s)" % (r, st["committed"], st["state"])
                             for r, st in ranks)))
        summary.append("engine %s: %s%s" % (e, "version " + "/".join(sorted(versions))
                                           if versions else "",
                                           " POISONED on %s" % poisoned if poisoned else ""))
    digests = {}
    for r, st in gens.items():
        if st["state"] != "POISONED" and "digest" in st:
            key = (st["tp_rank"], st["committed"])
            if digests.setdefault(key, st["digest"]) != st["digest"]:
                failures.append("tp rank %s of two engines differ at version %s" % key)
    phases = sorted({st["phase"] for st in statuses.values() if st})
    print("chaos %s run %d: rank %d (%s) killed %.2f s after start-up; survivors out in "
          "%.1f s (job %.1f s), phases %s; %s" %
          (args.transport, run, victim, sides[victim], delay, slowest, t_end - t_kill,
           ",".join(phases), "; ".join(summary)), flush=True)
    return failures, log_path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("config")
    ap.add_argument("--transport", required=True)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--max-delay", type=float, default=3.0)
    ap.add_argument("--exit-bound", type=float, default=None,
                    help="seconds after the kill by which survivors are out "
                         "(default 4 * timeout_s + 5)")
    ap.add_argument("--startup-bound", type=float, default=60.0)
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    if args.seed is None and os.environ.get("REFIT_CHAOS_SEED"):
        args.seed = int(os.environ["REFIT_CHAOS_SEED"])
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print("chaos: seed %d (repeat with --seed %d)" % (seed, seed), flush=True)
    rng = random.Random(seed)

    with open(args.config) as f:
        text = f.read()
    m = re.search(r"^\s+timeout_s:\s*([0-9.]+)", text, re.M)
    timeout_s = float(m.group(1))
    if args.exit_bound is None:
        args.exit_bound = 4 * timeout_s + 5
    text, n = re.subn(r"^(\s+transport:\s*)\w+", r"\g<1>" + args.transport, text, flags=re.M)
    if n != 1:
        sys.exit("chaos: %s has no refit.transport line to replace" % args.config)
    work = tempfile.mkdtemp(prefix="refit-chaos.")
    config = os.path.join(work, "chaos-%s.yaml" % args.transport)
    with open(config, "w") as f:
        f.write(text)
    failed = 0
    try:
        for run in range(1, args.kills + 1):
            failures, log_path = one_run(args, config, run, rng, work)
            if failures:
                failed += 1
                print("chaos %s run %d: FAIL:\n  %s" % (args.transport, run,
                                                        "\n  ".join(failures)))
                with open(log_path) as f:
                    lines = [l for l in f.read().splitlines() if "PMIX ERROR" not in l]
                print("  --- job output (last 40 lines) ---\n  " + "\n  ".join(lines[-40:]))
                sys.stdout.flush()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if failed:
        print("chaos: FAILED: %d of %d runs over %s (seed %d)" %
              (failed, args.kills, args.transport, seed))
        return 1
    print("chaos: ok: %d kills over %s, every survivor out within %.0f s, every engine "
          "on one verified version or POISONED (seed %d)" %
          (args.kills, args.transport, args.exit_bound, seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())

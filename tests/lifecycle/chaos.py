#!/usr/bin/env python3
"""Chaos test: kill a random rank of a long multi-refit job from outside.

    chaos.py BUILD CONFIG [--transport mpi,ucx] [--mode sync,async]
             [--trials N] [--phases early,mid,commit,late] [--seed S]
             [--pause SECONDS] [--timeout-s T] [--margin SECONDS]
             [--late-max SECONDS] [--max-delay SECONDS]

No fault seam: each trial starts CONFIG (a long run of refits) with
launch/refit-launch and refit-run --status-dir --pause P, waits until every
rank has opened its session (its pid file), and SIGKILLs a random rank at a
moment aimed at a phase. Trials cycle through the transports x modes and
the phases, so each gets its share:

  random  uniform in [0, --max-delay] s after start-up (the default, and
          what the ctest chaos_<transport> runs use),
  early   within the first 0.5 s after start-up (the first refit),
  mid     inside the transfer of refit k (k of 2..4): after rank 0 printed
          refit k-1's row, the pause, then a fraction of that row's total_s,
  commit  at the end of refit k (85..100 % of its total_s: the vote and,
          async, the shadow copied in),
  late    minutes in (log-uniform between 3 s and --late-max after start-up),
          in the pause between a commit and the next begin (refit 3's at
          the earliest).

Rows are timed as they reach the job's output, so the aim is approximate;
the summary lists the phases the survivors failed in next to the aims.
Then:

  - every surviving rank exits within P + 2 * timeout_s + margin of the kill
    (a refit's deadline of progress, then the vote's; the pause a survivor
    sleeps through first); a job still running then is a HANG (each hung
    rank gets a gdb backtrace, and the job is killed),
  - every survivor writes a status file naming the phase it failed in and
    the error, and naming the dead rank (its `lost=` line, refit-run's
    probe, also in the error text),
  - every generator's runtime storage verifies bit for bit against its
    committed version, or the generator says POISONED,
  - the tensor-parallel ranks of one engine agree on that version (an
    engine whose ranks are not POISONED serves one version), and ranks of
    the same tp rank in different engines holding one version hold the same
    bytes (digest),
  - no sanitizer report.

A split version (an engine whose ranks disagree, equal tp ranks whose
bytes differ, or storage that does not verify as its committed version), a
hang, an unnamed death or any other failure fails the run; a summary table
per aimed phase (trials, hangs, splits, unnamed deaths, other failures, the
slowest survivor's exit, the survivors' phases) ends the output, and the exit
status is non-zero on any failure. The nightly run is
`chaos.py BUILD tests/lifecycle/chaos-phases.yaml --trials 100
--mode sync,async --phases early,mid,commit,late --late-max 90 --seed 37`
(28 minutes on the 2-core machine: 0 hangs, splits or unnamed deaths).

The randomness is seeded (--seed, else $REFIT_CHAOS_SEED, else a fresh
one); the seed is printed first and repeats the victims and delays (not
the machine's timing).
"""
import argparse
import collections
import itertools
import math
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


ROW = re.compile(r"^\s*(\d+)\s+\d+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+"
                 r"([0-9.]+)\s+([0-9.]+)\s")


class Rows:
    """Rank 0's table rows as they reach the job's log: (arrival time, step,
    commit_s, total_s)."""

    def __init__(self, path):
        self.f = open(path)
        self.rows = []
        self.buf = ""

    def poll(self):
        self.buf += self.f.read()
        *lines, self.buf = self.buf.split("\n")
        now = time.time()
        for line in lines:
            m = ROW.match(line)
            if m:
                self.rows.append((now, int(m.group(1)), float(m.group(2)), float(m.group(3))))
        return self.rows

    def wait(self, count, job, until):
        """The row numbered `count` (1-based), or None once the job ended or
        `until` passed."""
        while time.time() < until and job.poll() is None:
            if len(self.poll()) >= count:
                return self.rows[count - 1]
            time.sleep(0.005)
        return None


def sleep_until(t):
    while True:
        d = t - time.time()
        if d <= 0:
            return
        time.sleep(min(d, 0.05))


def aim(args, phase, rng, rows, job, t_up):
    """When to kill for `phase`: an absolute time, or None when the job gave
    no row to aim at (it ended, or stalled)."""
    bound = t_up + args.startup_bound + args.late_max
    if phase == "random":
        return t_up + rng.uniform(0.0, args.max_delay)
    if phase == "early":
        return t_up + rng.uniform(0.0, 0.5)
    if phase in ("mid", "commit"):
        k = rng.randint(2, 4)
        row = rows.wait(k - 1, job, bound)
        if row is None:
            return None
        t_row, _, _, total = row
        frac = rng.uniform(0.1, 0.7) if phase == "mid" else rng.uniform(0.85, 1.0)
        return t_row + args.pause + frac * total
    # late: the pause after the first row that arrives past a moment minutes in,
    # and no earlier than refit 3's (a loaded machine may not have finished
    # refit 2 a few seconds in).
    at = t_up + math.exp(rng.uniform(math.log(3.0), math.log(max(args.late_max, 3.0))))
    sleep_until(at)
    row = rows.wait(max(len(rows.poll()) + 1, 3), job, at + args.startup_bound)
    if row is None or row[1] < 3:
        return None
    return row[0] + rng.uniform(0.0, 0.8) * args.pause


def one_run(args, trial, rng, work):
    """One job killed at a moment aimed at trial["phase"]. Returns
    ({category: [failure, ...]}, the log's path, a result record)."""
    run, config = trial["run"], trial["config"]
    status_dir = os.path.join(work, "status.%d" % run)
    os.mkdir(status_dir)
    log_path = os.path.join(work, "log.%d" % run)
    cmd = [os.path.join(ROOT, "launch", "refit-launch"), "--build-dir", args.build, config,
           "--", os.path.join(args.build, "runtime", "refit-run"), "--status-dir",
           status_dir, "--pause", str(args.pause), config]
    np = int(subprocess.check_output(
        [os.path.join(args.build, "runtime", "refit-plan"), "--world-size", config]))
    log = open(log_path, "w")
    job = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    rows = Rows(log_path)
    failures = collections.defaultdict(list)
    result = {"phase": trial["phase"], "exit_s": None, "survivor_phases": []}
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
        failures["other"].append("start-up: %d of %d ranks opened their session in %.0f s (job %s)" %
                                 (len(pids), np, args.startup_bound,
                                  "exited" if job.returncode is not None else "running"))
        return failures, log_path, result
    t_up = time.time()
    victim = rng.randrange(np)
    at = aim(args, trial["phase"], rng, rows, job, t_up)
    if at is not None:
        sleep_until(at)
    if at is None or job.poll() is not None:
        ended = job.poll() is not None
        if not ended:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        log.close()
        failures["other"].append("no moment to aim %s at: the job %s before the kill" %
                                 (trial["phase"], "ended" if ended else "printed no row in time"))
        return failures, log_path, result
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
        failures["hang"].append("HANG: ranks %s still running %.0f s after rank %d was killed\n%s" %
                                (sorted(hung), args.exit_bound, victim, backtraces(hung)))
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    log.close()
    with open(log_path) as f:
        text = f.read()
    if re.search(r"ERROR: AddressSanitizer|runtime error:", text):
        failures["other"].append("a sanitizer reported an error (log below)")
    if job.returncode == 0:
        failures["other"].append("the launcher reported success with rank %d killed" % victim)

    gens = {}
    slowest = 0.0
    for r, st in sorted(statuses.items()):
        if st is None:
            if job.returncode is not None and not failures["hang"]:
                failures["other"].append("rank %d wrote no status file" % r)
            continue
        slowest = max(slowest, float(st["time"]) - t_kill)
        result["survivor_phases"].append(st.get("phase", "none"))
        if float(st["time"]) - t_kill > args.exit_bound:
            failures["hang"].append("rank %d exited %.1f s after the kill (bound %.0f s)" %
                                    (r, float(st["time"]) - t_kill, args.exit_bound))
        if st["exit"] == "ok":
            failures["other"].append("rank %d says every refit succeeded with rank %d killed" %
                                     (r, victim))
        elif st.get("phase", "none") == "none" or not st.get("error"):
            failures["other"].append("rank %d failed without naming a phase and an error: %s" %
                                     (r, st))
        named = st.get("lost", "").split(",")
        if str(victim) not in named or ("rank %d " % victim) not in st.get("error", ""):
            failures["unnamed"].append("rank %d does not name the dead rank %d: lost=%s, error=%s" %
                                       (r, victim, st.get("lost", "(none)"), st.get("error")))
        if st.get("side") == "generator":
            gens[r] = st
            v = st.get("verify", "")
            if not (v == "ok" or (st["state"] == "POISONED" and v.startswith("skipped")) or
                    (st["committed"] == "0" and v.startswith("skipped"))):
                failures["split"].append("rank %d: runtime storage does not verify as version %s: %s" %
                                         (r, st["committed"], v))
    result["exit_s"] = slowest
    # One engine, one version: its ranks that are not POISONED agree.
    engines = {}
    for r, st in gens.items():
        engines.setdefault(st["engine"], []).append((r, st))
    summary = []
    for e, ranks in sorted(engines.items()):
        versions = {st["committed"] for r, st in ranks if st["state"] != "POISONED"}
        poisoned = [r for r, st in ranks if st["state"] == "POISONED"]
        if len(versions) > 1:
            failures["split"].append("engine %s is split: %s" % (
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
                failures["split"].append("tp rank %s of two engines differ at version %s" % key)
    phases = sorted(set(result["survivor_phases"]))
    print("chaos %s/%s trial %d (%s): rank %d (%s) killed %.2f s after start-up (%d rows); "
          "survivors out in %.1f s (job %.1f s), phases %s; %s" %
          (trial["transport"], trial["mode"], run, trial["phase"], victim, sides[victim],
           t_kill - t_up, len(rows.poll()), slowest, t_end - t_kill, ",".join(phases),
           "; ".join(summary)), flush=True)
    return failures, log_path, result


CATEGORIES = ("hang", "split", "unnamed", "other")


def print_summary(results):
    """One row per aimed phase and a total: trials, failures by kind, the
    slowest survivor's exit after the kill, and the phases survivors named."""
    print("\n%-8s %6s %6s %6s %8s %6s %8s  %s" %
          ("phase", "trials", "hangs", "splits", "unnamed", "other", "exit_s", "survivor phases"))
    by = collections.OrderedDict()
    for r in results:
        by.setdefault(r["phase"], []).append(r)
    by["total"] = results
    for phase, rs in by.items():
        seen = collections.Counter(p for r in rs for p in r["survivor_phases"])
        exits = [r["exit_s"] for r in rs if r["exit_s"] is not None]
        print("%-8s %6d %6d %6d %8d %6d %8s  %s" % (
            phase, len(rs), *[sum(1 for r in rs if r["failures"].get(c)) for c in CATEGORIES],
            "%.1f" % max(exits) if exits else "-",
            " ".join("%s:%d" % kv for kv in sorted(seen.items()))))
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("config")
    ap.add_argument("--transport", default="mpi,ucx",
                    help="comma-separated transports trials cycle through")
    ap.add_argument("--mode", default=None,
                    help="comma-separated modes (sync, async) trials cycle through "
                         "(default: the config's)")
    ap.add_argument("--trials", "--kills", dest="trials", type=int, default=10)
    ap.add_argument("--phases", default="random",
                    help="comma-separated aims: random, early, mid, commit, late")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--pause", type=float, default=0.0,
                    help="refit-run --pause: seconds between a commit and the next begin")
    ap.add_argument("--timeout-s", type=float, default=None,
                    help="refit.timeout_s for the job (default: the config's)")
    ap.add_argument("--margin", type=float, default=5.0,
                    help="seconds beyond pause + 2 * timeout_s by which survivors are out")
    ap.add_argument("--max-delay", type=float, default=3.0)
    ap.add_argument("--late-max", type=float, default=10.0,
                    help="late kills land up to this many seconds after start-up")
    ap.add_argument("--startup-bound", type=float, default=60.0)
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    if args.seed is None and os.environ.get("REFIT_CHAOS_SEED"):
        args.seed = int(os.environ["REFIT_CHAOS_SEED"])
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print("chaos: seed %d (repeat with --seed %d)" % (seed, seed), flush=True)
    rng = random.Random(seed)
    phases = args.phases.split(",")
    for p in phases:
        if p not in ("random", "early", "mid", "commit", "late"):
            sys.exit("chaos: unknown phase %s" % p)
    if phases != ["random"] and args.pause <= 0:
        args.pause = 0.5  # aiming needs a gap between refits

    with open(args.config) as f:
        base = f.read()
    if args.timeout_s is not None:
        base = re.sub(r"^(\s+timeout_s:\s*)[0-9.]+", r"\g<1>%g" % args.timeout_s, base, flags=re.M)
    timeout_s = float(re.search(r"^\s+timeout_s:\s*([0-9.]+)", base, re.M).group(1))
    args.exit_bound = args.pause + 2 * timeout_s + args.margin
    work = tempfile.mkdtemp(prefix="refit-chaos.")
    combos = []
    for transport in args.transport.split(","):
        text, n = re.subn(r"^(\s+transport:\s*)\w+", r"\g<1>" + transport, base, flags=re.M)
        if n != 1:
            sys.exit("chaos: %s has no refit.transport line to replace" % args.config)
        for mode in (args.mode.split(",") if args.mode else [None]):
            if mode is not None:
                text = re.sub(r"^\s+mode:.*\n", "", text, flags=re.M)
                text = re.sub(r"^(refit:\n)", r"\g<1>  mode: %s\n" % mode, text, flags=re.M)
            config = os.path.join(work, "chaos-%s-%s.yaml" % (transport, mode or "config"))
            with open(config, "w") as f:
                f.write(text)
            combos.append((transport, mode or "config", config))
    print("chaos: %d trials over %s, aims %s, timeout_s %g, pause %g s, exit bound %.1f s" %
          (args.trials, ", ".join("%s/%s" % c[:2] for c in combos), ",".join(phases),
           timeout_s, args.pause, args.exit_bound), flush=True)
    # Phases cycle fastest; each round of them starts one combination on, so
    # a few trials already reach every combination and, over rounds, every
    # combination meets every phase.
    plan = ((combos[(r + j) % len(combos)], p)
            for r in itertools.count() for j, p in enumerate(phases))
    results = []
    try:
        for run in range(1, args.trials + 1):
            (transport, mode, config), phase = next(plan)
            trial = {"run": run, "transport": transport, "mode": mode, "config": config,
                     "phase": phase}
            failures, log_path, result = one_run(args, trial, rng, work)
            result["failures"] = failures
            results.append(result)
            if any(failures.values()):
                print("chaos %s/%s trial %d (%s): FAIL:\n  %s" % (
                    transport, mode, run, phase,
                    "\n  ".join("%s: %s" % (c, f) for c in CATEGORIES for f in failures[c])))
                with open(log_path) as f:
                    lines = [l for l in f.read().splitlines() if "PMIX ERROR" not in l]
                print("  --- job output (last 40 lines) ---\n  " + "\n  ".join(lines[-40:]))
                sys.stdout.flush()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_summary(results)
    failed = sum(1 for r in results if any(r["failures"].values()))
    if failed:
        print("chaos: FAILED: %d of %d trials (seed %d)" % (failed, len(results), seed))
        return 1
    print("chaos: ok: %d trials, every survivor out within %.0f s naming the dead rank, "
          "every engine on one verified version or POISONED (seed %d)" %
          (len(results), args.exit_bound, seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())

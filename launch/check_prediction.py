#!/usr/bin/env python3
"""The planner's prediction against a measured refit, bucket by bucket.

    launch/check_prediction.py CONFIG [--set KEY=VALUE ...] [--steps N]
                               [--build-dir DIR] [--out DIR] [--json FILE] [--gpu]

For one config, in one go on the machine it runs on:

1. the link: plain messages between the job's ranks in the refit's pattern
   (launch/bench_host_link.py: every trainer to every generator at once, 64
   MiB per pair; when refit.transport is ucx, through Open MPI's UCX layer
   with UCX_TLS=--ucx-tls, default tcp,self: refit's UCX transport asks for
   peer error handling, which UCX 1.13 serves on one host over TCP only), or
   with --gpu a device-to-device copy of the one GPU (the CUDA IPC
   transport of two processes on one GPU copies within it);
2. the copy rate the prediction charges the ranks' passes at: numpy copies
   of a bucket's size on every rank at once (launch/bench_host_copy.py),
   just before the refit and again just after it (on a shared machine the
   rate moves: the prediction takes their mean and says how far each end
   moves it), or with --gpu the same device copy;
3. the prediction: `refit-plan JOB --link-gbps L --copy-gbps C --buckets`
   (--overlap pack for MPI in host memory, whose receiver moves the bytes
   in its own transport calls; none for UCX, which needs both ends in their
   calls; full on the GPU; with --gpu every pair sits on one "node" whose
   lane is the device copy: --gpus-per-node = the world, --nvlink-gbps =
   the copy rate);
4. the refit with refit.timeline on (launch/refit-launch JOB), every rank's
   bucket marks of every refit but the first (the first faults its memory
   in);

and prints, per bucket, the predicted and measured pack (busiest trainer),
transfer (the generators' wait), land (busiest generator, restore save
included) and when the bucket has landed everywhere, counted from the moment
the last trainer holds the new weights (its source done); then the totals
with the error, next to the link-only prediction and refit-run's refit_s.
Measured figures are medians over the refits. --set KEY=VALUE overrides a
config key (dotted: refit.transport=ucx, refit.precision=mxfp8); the job's
files (config, timelines, logs) stay in --out (default: a new temporary
folder). --json FILE writes the table and totals.
"""

import argparse
import glob
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
UCX_MPI = "--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any -x UCX_TLS=%s"


def find_python(modules):
    """The first of this interpreter, python3 and /usr/bin/python3 that
    imports `modules` (a pyenv python3 on PATH may lack Debian's)."""
    for candidate in (sys.executable, "python3", "/usr/bin/python3"):
        if subprocess.run([candidate, "-c", "import " + ", ".join(modules)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
            return candidate
    sys.exit("check_prediction: no python imports %s (give --python)" % ", ".join(modules))


def run(cmd, log):
    """Run cmd, keep its output in log, return it; a failure ends the check."""
    print("check_prediction: $ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(log, "w") as f:
        f.write(p.stdout)
    if p.returncode != 0:
        sys.exit("check_prediction: failed (exit %d), output in %s:\n%s"
                 % (p.returncode, log, p.stdout[-3000:]))
    return p.stdout


def number(pattern, text, what):
    m = re.search(pattern, text, re.M)
    if not m:
        sys.exit("check_prediction: no %s in:\n%s" % (what, text[-2000:]))
    return float(m.group(1))


def make_job(config, sets, steps, out):
    """The config with --set applied, refit.timeline and refit.steps set,
    its relative paths made absolute; written to out/job.yaml."""
    with open(config) as f:
        cfg = yaml.safe_load(f)
    base = os.path.dirname(os.path.abspath(config))
    for key in (("model", "hf_config"), ("source", "path"), ("reference", "path")):
        sec = cfg.get(key[0]) or {}
        if sec.get(key[1]) and not os.path.isabs(str(sec[key[1]])):
            sec[key[1]] = os.path.join(base, str(sec[key[1]]))
    for s in sets:
        key, _, value = s.partition("=")
        node = cfg
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        parsed = yaml.safe_load(value)
        # YAML 1.1 reads on/off/yes/no as booleans; refit's enums take them
        # as names (refit.zero_copy: off).
        if isinstance(parsed, bool) and value.strip().lower() not in ("true", "false"):
            parsed = value.strip()
        node[parts[-1]] = parsed
    cfg.setdefault("refit", {})
    cfg["refit"]["timeline"] = os.path.join(out, "tl")
    cfg["refit"]["steps"] = steps
    job = os.path.join(out, "job.yaml")
    with open(job, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    return job, cfg


def gpu_copy_gbps(python):
    """The device-to-device copy rate of GPU 0 (torch), best of 5 copies of
    1 GiB, timed with CUDA events."""
    code = (
        "import torch\n"
        "n = 1 << 30\n"
        "a = torch.randint(0, 256, (n,), dtype=torch.uint8, device='cuda')\n"
        "b = torch.empty_like(a)\n"
        "b.copy_(a)\n"
        "ts = []\n"
        "for _ in range(5):\n"
        "    e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)\n"
        "    e0.record(); b.copy_(a); e1.record(); e1.synchronize()\n"
        "    ts.append(e0.elapsed_time(e1) / 1e3)\n"
        "assert torch.equal(a, b)\n"
        "print('d2d %.3f' % (n / min(ts) / 1e9))\n")
    out = subprocess.run([python, "-c", code], stdout=subprocess.PIPE, text=True, check=True)
    return number(r"^d2d ([0-9.]+)", out.stdout, "device copy rate")


def predicted_buckets(text):
    rows = []
    for m in re.finditer(r"^\s+(\d+)" + r"\s+([0-9.]+)" * 6 + r"\s+(\d+)\s+(\d+)\s+(\d+)$",
                         text, re.M):
        v = [float(x) for x in m.groups()]
        rows.append(dict(pack=v[1], xfer=v[2], land=v[3], pack_end=v[4], xfer_end=v[5],
                         land_end=v[6], pack_bytes=int(v[7]), land_bytes=int(v[8]),
                         save_bytes=int(v[9])))
    return rows


def replay(stages, overlap):
    """The schedule of refit-plan's pipelined prediction (reshard/plan_stats.c,
    refit_plan_predict_passes) over given stage lengths: each bucket's end
    of pack, transfer and land. Fed the measured pack and land, it tells the
    schedule's share of an error from the rates' share."""
    ends = []
    for b, (pack, xfer, land) in enumerate(stages):
        prev = ends[b - 1] if b > 0 else (0.0, 0.0, 0.0)
        prev2 = ends[b - 2] if b > 1 else (0.0, 0.0, 0.0)
        pack_end = max(prev[0], prev2[1]) + pack
        start = max(pack_end, prev[1], prev2[2] if overlap == "full" else prev[2])
        if overlap == "none" and b + 1 < len(stages):
            start = max(start, max(pack_end, prev[1]) + stages[b + 1][0])
        xfer_end = start + xfer
        ends.append((pack_end, xfer_end, max(xfer_end, prev[2]) + land))
    return ends


def load_refits(prefix):
    """{attempt: [rank's timeline, ...]} from prefix.refit<A>.rank<R>.json."""
    refits = {}
    for path in glob.glob(prefix + ".refit*.rank*.json"):
        m = re.search(r"\.refit(\d+)\.rank(\d+)\.json$", path)
        with open(path) as f:
            refits.setdefault(int(m.group(1)), []).append(json.load(f))
    return refits


def measure(ranks):
    """One refit's per-bucket figures, every rank's clock lined up on t0 (one
    host: CLOCK_MONOTONIC is shared), from the last trainer's source end."""
    trainers = [r for r in ranks if r["side"] == "trainer"]
    gens = [r for r in ranks if r["side"] == "generator"]

    def ready(r):
        ph = r["phases"]
        return r["t0"] + (ph["source"][1] if ph["source"] else ph["begin"][1])

    origin = max(ready(r) for r in trainers)
    nb = ranks[0]["buckets"]
    rows = []
    for b in range(nb):
        def span(rs, key):
            return max(r["bucket"][b][key][1] - r["bucket"][b][key][0] for r in rs)

        def cpu(rs, key):
            return max(r["bucket"][b]["cpu"][key] for r in rs)
        rows.append(dict(
            pack=span(trainers, "pack"),
            wait=span(gens, "wait"),
            land=span(gens, "land"),
            pack_cpu=cpu(trainers, "pack"),
            land_cpu=cpu(gens, "land"),
            land_end=max(r["t0"] + r["bucket"][b]["land"][1] for r in gens) - origin))
    # Every rank's passes summed: their length and the CPU time in them.
    use = {}
    for key, rs in (("pack", trainers), ("wait", gens), ("land", gens)):
        use[key] = (sum(b[key][1] - b[key][0] for r in rs for b in r["bucket"]),
                    sum(b["cpu"][key] for r in rs for b in r["bucket"]))
    return rows, use


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--build-dir", default=os.environ.get("REFIT_BUILD_DIR",
                                                          os.path.join(ROOT, "build")))
    ap.add_argument("--out")
    ap.add_argument("--json")
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--ucx-tls", default="tcp,self",
                    help="UCX_TLS of the link benchmark when refit.transport is ucx")
    ap.add_argument("--python",
                    help="the python the benchmarks run in: with mpi4py, numpy and yaml "
                    "(host) or torch (--gpu); default: the first of this one, python3, "
                    "/usr/bin/python3 that has them")
    args = ap.parse_args()
    args.python = args.python or find_python(["torch"] if args.gpu else
                                             ["mpi4py", "numpy", "yaml"])
    out = os.path.abspath(args.out or tempfile.mkdtemp(prefix="check-prediction."))
    os.makedirs(out, exist_ok=True)
    for old in glob.glob(os.path.join(out, "tl.refit*.json")):
        os.remove(old)
    job, cfg = make_job(args.config, args.set, args.steps, out)
    launch = [os.path.join(HERE, "refit-launch"), "--build-dir", args.build_dir]
    plan = os.path.join(args.build_dir, "runtime", "refit-plan")
    transport = (cfg.get("refit") or {}).get("transport", "auto")
    world = int(run([plan, "--world-size", job], os.path.join(out, "world.log")))
    load = os.getloadavg()

    if args.gpu:
        link = copy = gpu_copy_gbps(args.python)
        alone = copy
        overlap = "full"
        net = ["--link-gbps", "%.3f" % link, "--nvlink-gbps", "%.3f" % link,
               "--gpus-per-node", str(world), "--overlap", "full"]
    else:
        extra = ["--launcher-args", UCX_MPI % args.ucx_tls] if transport == "ucx" else []
        text = run(launch + extra + [job, "--", args.python,
                                     os.path.join(HERE, "bench_host_link.py"), job,
                                     "--mib", "64"],
                   os.path.join(out, "link.log"))
        link = number(r"per-generator ingress ([0-9.]+) GB/s", text, "link rate")
        bench_copy = launch + [job, "--", args.python, os.path.join(HERE, "bench_host_copy.py"),
                               job]
        text = run(bench_copy, os.path.join(out, "copy.log"))
        copy = number(r"per-rank copy ([0-9.]+) GB/s", text, "copy rate")
        alone = number(r"one rank alone: ([0-9.]+) GB/s", text, "copy rate alone")
        overlap = "none" if transport == "ucx" else "pack"
        net = ["--link-gbps", "%.3f" % link, "--overlap", overlap]
    text = run(launch + [job], os.path.join(out, "refit.log"))
    load_after = os.getloadavg()
    copy_before, copy_after = copy, copy
    if not args.gpu:
        after = run(bench_copy, os.path.join(out, "copy_after.log"))
        copy_after = number(r"per-rank copy ([0-9.]+) GB/s", after, "copy rate")
        alone = (alone + number(r"one rank alone: ([0-9.]+) GB/s", after, "copy rate")) / 2
        copy = (copy_before + copy_after) / 2

    def pipelined_at(rate, log, buckets=False):
        out_text = run([plan, job, "--copy-gbps", "%.3f" % rate] + net +
                       (["--buckets"] if buckets else []), os.path.join(out, log))
        return number(r"^\s*pipelined\s+([0-9.]+) s", out_text, "pipelined prediction"), out_text

    pipelined, plan_text = pipelined_at(copy, "plan.log", True)
    pred = predicted_buckets(plan_text)
    link_only = number(r"^\s*predicted\s+([0-9.]+) s", plan_text, "prediction")
    pipelined_alone, _ = pipelined_at(alone, "plan_alone.log")
    ends = sorted(pipelined_at(r, "plan_%d.log" % i)[0]
                  for i, r in enumerate((copy_before, copy_after)))

    refit_s = [float(m.group(1)) for m in
               re.finditer(r"^\s+\d+\s+\d+(?:\s+[0-9.]+){6}\s+([0-9.]+)\s", text, re.M)]
    refits = load_refits(os.path.join(out, "tl"))
    attempts = sorted(refits)[1:] if len(refits) > 1 else sorted(refits)
    if not attempts or any(len(refits[a]) != world for a in attempts):
        sys.exit("check_prediction: timelines missing in %s" % out)
    per = [measure(refits[a]) for a in attempts]
    nb = len(pred)
    if any(len(rows) != nb for rows, _ in per):
        sys.exit("check_prediction: %d buckets predicted, the timelines have others" % nb)

    def med(key, b):
        return statistics.median(rows[b][key] for rows, _ in per)

    table = []
    for b in range(nb):
        table.append(dict(bucket=b, pack_pred=pred[b]["pack"], pack_meas=med("pack", b),
                          xfer_pred=pred[b]["xfer"], wait_meas=med("wait", b),
                          land_pred=pred[b]["land"], land_meas=med("land", b),
                          end_pred=pred[b]["land_end"], end_meas=med("land_end", b),
                          pack_core=pred[b]["pack_bytes"] / (alone * 1e9),
                          pack_cpu=med("pack_cpu", b),
                          land_core=(pred[b]["land_bytes"] + pred[b]["save_bytes"]) /
                          (alone * 1e9),
                          land_cpu=med("land_cpu", b)))
    measured = table[-1]["end_meas"] if table else 0.0
    replayed = replay([(r["pack_meas"], r["xfer_pred"], r["land_meas"]) for r in table],
                      overlap)
    for r, e in zip(table, replayed):
        r["end_replay"] = e[2]
    use = {k: [statistics.median(u[k][i] for _, u in per) for i in (0, 1)]
           for k in ("pack", "wait", "land")}
    cores = os.cpu_count() or 1
    summary = dict(config=args.config, sets=args.set, transport=transport, ranks=world,
                   overlap=overlap,
                   buckets=nb, link_gbps=link, copy_gbps=copy, copy_alone_gbps=alone,
                   copy_before_gbps=copy_before, copy_after_gbps=copy_after,
                   link_only_s=link_only, pipelined_s=pipelined, pipelined_range_s=ends,
                   pipelined_alone_s=pipelined_alone, measured_s=measured,
                   error=(pipelined - measured) / measured if measured else None,
                   refit_s=statistics.median(refit_s[1:] or refit_s) if refit_s else None,
                   passes=use, cores=cores, refits=len(attempts),
                   loadavg=[round(x, 2) for x in load],
                   loadavg_after=[round(x, 2) for x in load_after])

    print("\ncheck_prediction: %s%s, %d ranks, transport %s, %d buckets, load average "
          "%.2f %.2f %.2f at the start, %.2f %.2f %.2f after the refit" % (
              args.config, "".join(" --set " + s for s in args.set), world, transport, nb,
              *load, *load_after))
    print("  link %.3f GB/s, copy %.3f GB/s per rank with all ranks copying (%.3f before, "
          "%.3f after the refit; %.3f alone)" % (link, copy, copy_before, copy_after, alone))
    print("\n  %6s %9s %9s %9s %9s %9s %9s %9s %9s %7s %9s" % (
        "bucket", "pack_pre", "pack_mea", "xfer_pre", "wait_mea", "land_pre", "land_mea",
        "end_pre", "end_mea", "err", "end_rep"))
    for r in table:
        err = (r["end_pred"] - r["end_meas"]) / r["end_meas"] if r["end_meas"] else 0.0
        print("  %6d %9.4f %9.4f %9.4f %9.4f %9.4f %9.4f %9.4f %9.4f %+6.0f%% %9.4f" % (
            r["bucket"], r["pack_pred"], r["pack_meas"], r["xfer_pred"], r["wait_meas"],
            r["land_pred"], r["land_meas"], r["end_pred"], r["end_meas"], 100 * err,
            r["end_replay"]))
    print("  (end_rep: the prediction's schedule replayed over the measured pack and land "
          "and the predicted transfer)")
    summary.update(replay_s=table[-1]["end_replay"] if table else 0.0)
    if not args.gpu:
        # Host passes run on the rank's CPU: their CPU seconds are their work.
        # (On a GPU the CPU only waits for the kernels.)
        print("\n  on a core: each pass's charged bytes at the copy rate of one rank alone "
              "against the CPU seconds it took\n  (busiest rank; ratio = measured / predicted)")
        print("\n  %6s %9s %9s %7s %9s %9s %7s" % ("bucket", "pack_pre", "pack_cpu", "ratio",
                                                 "land_pre", "land_cpu", "ratio"))
        for r in table:
            print("  %6d %9.4f %9.4f %7.2f %9.4f %9.4f %7.2f" % (
                r["bucket"], r["pack_core"], r["pack_cpu"], r["pack_cpu"] / r["pack_core"],
                r["land_core"], r["land_cpu"], r["land_cpu"] / r["land_core"]))
        summary.update(
            pack_cpu_ratio=sum(r["pack_cpu"] for r in table) / sum(r["pack_core"] for r in table),
            land_cpu_ratio=sum(r["land_cpu"] for r in table) / sum(r["land_core"] for r in table))
    print("\n  measured: last bucket landed %.4f s after the last trainer's source "
          "(median of %d refits); refit-run refit_s %.4f s" % (
              measured, len(attempts), summary["refit_s"] or 0.0))
    print("  predicted: pipelined %.4f s (%+.0f%%; %.4f to %.4f s at the copy rates before "
          "and after); with the copy rate of one rank alone "
          "%.4f s (%+.0f%%); link only %.4f s (%+.0f%%)" % (
              pipelined, 100 * summary["error"], ends[0], ends[1], pipelined_alone,
              100 * (pipelined_alone - measured) / measured, link_only,
              100 * (link_only - measured) / measured))
    if not args.gpu:
        print("  passes summed over ranks, wall / CPU seconds: pack %.4f / %.4f, generators' "
              "wait %.4f / %.4f, land %.4f / %.4f; CPU of pack and land over %d cores: %.4f s"
              % (use["pack"][0], use["pack"][1], use["wait"][0], use["wait"][1],
                 use["land"][0], use["land"][1], cores,
                 (use["pack"][1] + use["land"][1]) / cores))
        summary.update(pack_off_core=use["pack"][0] / use["pack"][1],
                       land_off_core=use["land"][0] / use["land"][1])
        print("  on a core, passes took %.2fx (pack) and %.2fx (land) their predicted time; "
              "off their core (wall / CPU) %.2fx and %.2fx" % (
                  summary["pack_cpu_ratio"], summary["land_cpu_ratio"],
                  summary["pack_off_core"], summary["land_off_core"]))
    print("  files: %s" % out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(summary=summary, buckets=table), f, indent=1)


if __name__ == "__main__":
    main()

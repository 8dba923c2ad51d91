#!/usr/bin/env python3
"""refit.timeline end to end: a refit job with the timeline on, then every
file checked for form and consistency (not for timing).

    check_timeline.py BUILD_DIR CONFIG

Runs launch/refit-launch on CONFIG with refit.timeline set to a prefix in a
temporary folder and requires, for every committed refit and every rank, a
file PREFIX.refit<A>.rank<R>.json that parses, names its rank, side, version
and attempt, and holds refit-plan's number of buckets, each once and in
order, with every interval ordered (start <= end) and inside the refit
(from 0 to the commit's end); trainers with a pack and no land, generators
the reverse; a trainer's send posted after its pack, a generator's land
after its wait, each bucket landed after the one before; and per bucket the
bytes the trainers sent equal to the bytes the generators received.
Standard library only.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def ordered(span, what, end):
    check(span is not None and None not in span, "%s: not marked" % what)
    if span is None or None in span:
        return
    check(0.0 <= span[0] <= span[1] <= end, "%s: %r not ordered within [0, %.6f]"
          % (what, span, end))


def main():
    build, config = sys.argv[1], sys.argv[2]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    tmp = tempfile.mkdtemp(prefix="refit-timeline.")
    try:
        prefix = os.path.join(tmp, "tl")
        with open(config) as f:
            text = f.read()
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as f:
            f.write(re.sub(r"^refit:\n", "refit:\n  timeline: %s\n" % prefix, text,
                           count=1, flags=re.M))
        plan = subprocess.run([os.path.join(build, "runtime", "refit-plan"), job],
                              stdout=subprocess.PIPE, text=True, check=True).stdout
        nb = int(re.search(r"^\s*buckets\s+(\d+)", plan, re.M).group(1))
        ranks = int(re.search(r"= (\d+)$", re.search(r"^\s*ranks .*$", plan, re.M).group(0))
                    .group(1))
        steps = int(re.search(r"^\s*steps:\s*(\d+)", text, re.M).group(1))
        run = subprocess.run([os.path.join(root, "launch", "refit-launch"), "--build-dir",
                              build, job], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        print(run.stdout)
        check(run.returncode == 0, "refit-launch exited %d" % run.returncode)
        files = sorted(glob.glob(prefix + ".refit*.rank*.json"))
        check(len(files) == steps * ranks, "%d timeline files, expected %d refits x %d ranks"
              % (len(files), steps, ranks))
        for attempt in range(1, steps + 1):
            sent, got = [0] * nb, [0] * nb
            for rank in range(ranks):
                path = "%s.refit%d.rank%d.json" % (prefix, attempt, rank)
                if not os.path.exists(path):
                    check(False, "%s: missing" % path)
                    continue
                with open(path) as f:
                    t = json.load(f)
                name = os.path.basename(path)
                check(t["format"] == "refit-timeline-1", "%s: format %r" % (name, t["format"]))
                check(t["rank"] == rank and t["attempt"] == attempt and
                      t["version"] == attempt, "%s: rank/attempt/version %r/%r/%r" % (
                          name, t["rank"], t["attempt"], t["version"]))
                check(t["buckets"] == nb and len(t["bucket"]) == nb,
                      "%s: %r buckets, refit-plan says %d" % (name, t["buckets"], nb))
                ph = t["phases"]
                end = ph["commit"][1] if ph["commit"] and ph["commit"][1] is not None else 0.0
                ordered(ph["begin"], name + " begin", end)
                ordered(ph["commit"], name + " commit", end)
                check(ph["progress_end"] is not None and
                      ph["begin"][1] <= ph["progress_end"] <= ph["commit"][0],
                      "%s: progress_end %r outside begin .. commit" % (name, ph["progress_end"]))
                trainer = t["side"] == "trainer"
                check(t["side"] in ("trainer", "generator"), "%s: side %r" % (name, t["side"]))
                check((ph["source"] is not None) == trainer, "%s: source %r" % (name, ph["source"]))
                last_land = 0.0
                for b, e in enumerate(t["bucket"]):
                    what = "%s bucket %d" % (name, b)
                    check(e["b"] == b, "%s: listed as %r" % (what, e["b"]))
                    check(e["bytes"] > 0, "%s: %r bytes" % (what, e["bytes"]))
                    check(e["post"] is not None and 0.0 <= e["post"] <= end,
                          "%s: post %r" % (what, e["post"]))
                    ordered(e["wait"], what + " wait", end)
                    for key in ("pack", "wait", "land"):
                        c = e["cpu"][key]
                        check(c is None or c >= 0, "%s: cpu %s %r" % (what, key, c))
                    if trainer:
                        sent[b] += e["bytes"]
                        ordered(e["pack"], what + " pack", end)
                        check(e["land"] is None, "%s: a trainer that lands" % what)
                        if e["pack"]:
                            check(e["pack"][1] <= e["post"], "%s: posted before packed" % what)
                    else:
                        got[b] += e["bytes"]
                        ordered(e["land"], what + " land", end)
                        check(e["pack"] is None, "%s: a generator that packs" % what)
                        if e["land"] and e["wait"]:
                            check(e["wait"][1] <= e["land"][0], "%s: landed before it "
                                  "arrived" % what)
                            check(e["land"][0] >= last_land, "%s: landed before bucket %d"
                                  % (what, b - 1))
                            last_land = e["land"][1]
            check(sent == got, "refit %d: bytes sent per bucket %r, received %r"
                  % (attempt, sent, got))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for f in failures[:20]:
        print("check_timeline: FAIL: " + f)
    if failures:
        sys.exit(1)
    print("check_timeline: %d refits x %d ranks x %d buckets well-formed and consistent"
          % (steps, ranks, nb))


if __name__ == "__main__":
    main()

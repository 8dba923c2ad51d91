#!/usr/bin/env python3
"""run_reference.py BUILD_DIR CONFIG [safetensors]
   run_reference.py BUILD_DIR --batch hdf5|safetensors CONFIG...

Refit a fresh random checkpoint with the config's layout and check every
generator byte against the independent vLLM reference (vllm_rules.py,
through check_dump.py). With `safetensors` the same weights are refitted
from a Hugging Face safetensors checkpoint written by write_safetensors.py
(the format's own rules, not refit's writer), one file or (odd seeds) three
shards and an index, and the generator bytes are checked against the HDF5
weights. Each run draws a new source.seed and, from it, the checkpoint's
element type (bf16, f32 or f16, so that the reader's conversions are
exercised too) and prints both; REFIT_REFERENCE_SEED=N repeats a run and
REFIT_REFERENCE_DTYPE overrides the element type.

--batch: the same for each CONFIG, every refit in one MPI job (refit-run
with several configs, one after another; the job's start-up paid once
instead of once each); one line per scenario, ok or FAIL with its seed and
the command that runs it alone with that seed.

This one interpreter runs every Python step (the two configs, the DeepSeek
checkpoint's MTP layer, the safetensors writer, the check), each a process
of its own before: every one of them started Python and imported numpy,
h5py and PyYAML again. refit-ckpt and the refit itself (refit-launch) are
the processes they were.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import check_dump  # noqa: E402  (found next to this file)
import write_safetensors  # noqa: E402


def say(msg):
    print("run_reference: " + msg, flush=True)


def step(what, cmd, **kw):
    """Run one program; a non-zero exit fails the test, naming the step."""
    try:
        rc = subprocess.run(cmd, **kw).returncode
    except OSError as e:
        say(f"FAIL: {what}: {e}")
        sys.exit(1)
    if rc != 0:
        say(f"FAIL: {what} exited with status {rc}")
        sys.exit(1)


def write_configs(config, work, seed, fmt):
    """Two copies of the config: one that makes the checkpoint from the seed,
    one that refits from that checkpoint and dumps the generator tensors.
    Returns the refit's config and its number of refits (refit.steps)."""
    with open(config) as f:
        cfg = yaml.safe_load(f)
    cfg["source"] = {"kind": "synthetic", "seed": seed}
    with open(f"{work}/ckpt.yaml", "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    if fmt == "safetensors":
        cfg["source"] = {"kind": "safetensors", "path": f"{work}/ckpt-st", "seed": seed}
    else:
        cfg["source"] = {"kind": "hdf5", "path": f"{work}/ckpt.h5", "seed": seed}
    cfg["dump"] = f"{work}/dump.h5"
    with open(f"{work}/run.yaml", "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    return cfg, (cfg.get("refit") or {}).get("steps", 3)


def add_mtp_layer(model, path):
    """A DeepSeek checkpoint holds its multi-token-prediction layer as
    model.layers.<num_layers> (num_nextn_predict_layers), which vLLM's main
    model skips by name and refit does not move: give the checkpoint one, of
    values the reference never reads."""
    if model["family"] != "deepseek_v3":
        return
    h, L = model["hidden_size"], model["num_layers"]
    with h5py.File(path, "a") as f:
        for rest, shape in (("enorm.weight", (h,)), ("hnorm.weight", (h,)),
                            ("eh_proj.weight", (h, 2 * h)), ("input_layernorm.weight", (h,)),
                            ("shared_head.norm.weight", (h,))):
            d = f.create_dataset(f"model.layers.{L}.{rest}", data=np.full(shape, 0x7fc0, np.uint16))
            d.attrs["dtype"] = "bfloat16"
    say(f"MTP layer model.layers.{L} in the checkpoint")


class Scenario:
    """One config refitted from a checkpoint in one format: its seed and
    element type (drawn, or REFIT_REFERENCE_SEED / REFIT_REFERENCE_DTYPE),
    its work directory and the config its refit runs (run.yaml)."""

    def __init__(self, build, config, fmt):
        self.build, self.config, self.fmt = build, config, fmt
        seed = os.environ.get("REFIT_REFERENCE_SEED") or int.from_bytes(os.urandom(4), "little")
        self.seed = int(seed)
        self.dtype = os.environ.get("REFIT_REFERENCE_DTYPE") or ("bf16", "f32", "f16")[self.seed % 3]
        self.work = tempfile.mkdtemp()
        self.run_yaml = f"{self.work}/run.yaml"

    def name(self):
        base = os.path.splitext(os.path.basename(self.config))[0]
        return base + ("" if self.fmt == "hdf5" else " (" + self.fmt + ")")

    def rerun(self):
        """The command that runs this scenario alone, with the same seed."""
        return (f"REFIT_REFERENCE_SEED={self.seed} {HERE}/run_reference.sh {self.build} "
                f"{self.config}" + ("" if self.fmt == "hdf5" else " " + self.fmt))

    def prepare(self):
        """The checkpoint and the refit's config (run.yaml)."""
        say(f"{self.config} with source.seed {self.seed}, checkpoint {self.dtype} "
            f"(REFIT_REFERENCE_SEED={self.seed} repeats it)")
        cfg, steps = write_configs(self.config, self.work, self.seed, self.fmt)
        # refit-run refits versions 1..steps and an HDF5 checkpoint holds one
        # version that every refit reads, so the dump (version `steps`) holds
        # the checkpoint's values whatever version they were made for; making
        # them for version `steps` keeps the version attributes of checkpoint
        # and dump equal.
        step("refit-ckpt", [f"{self.build}/runtime/refit-ckpt", f"{self.work}/ckpt.yaml",
                            f"{self.work}/ckpt.h5", "--version", str(steps),
                            "--dtype", self.dtype])
        add_mtp_layer(cfg["model"], f"{self.work}/ckpt.h5")
        if self.fmt == "safetensors":
            shards = 3 if self.seed % 2 else 1
            write_safetensors.write(f"{self.work}/ckpt.h5", f"{self.work}/ckpt-st", shards)
            say(f"safetensors checkpoint, {shards} file(s)")

    def check(self):
        """0 when every byte of the dump is the reference's."""
        try:
            return check_dump.check(self.run_yaml, f"{self.work}/ckpt.h5",
                                    f"{self.work}/dump.h5")
        except SystemExit as e:  # check_dump's way of refusing a dump
            print(e, flush=True)
            return 1

    def remove(self):
        shutil.rmtree(self.work, ignore_errors=True)


def launch(build, configs, log):
    """One job through the project's launcher: refit-run on each config in
    turn (several: the job has the largest world size among them). Returns
    its exit status."""
    cmd = [f"{ROOT}/launch/refit-launch", "--build-dir", build]
    if len(configs) > 1:
        np_ = subprocess.run([f"{build}/runtime/refit-plan", "--world-size", *configs],
                             capture_output=True, text=True)
        if np_.returncode == 0:
            cmd += ["--np", np_.stdout.strip()]
        cmd += [configs[0], "--", f"{build}/runtime/refit-run", *configs]
    else:
        cmd += configs
    return subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode


def sections(job_output, scenarios):
    """Each scenario's part of a batch job's output and its exit status: a
    list of (lines, status), status None where the config never ended. The
    cutting is tests/split_batch.awk's, the one parser of refit-run's
    per-config lines (tests/mpi/run_batch.sh uses it too)."""
    table = f"{scenarios[0].work}/sections"
    with open(table, "w") as f:
        for sc in scenarios:
            f.write(f"{sc.run_yaml}\t{sc.work}/run\n")
    step("split_batch.awk", ["awk", "-v", f"sections={table}", "-f",
                             f"{ROOT}/tests/split_batch.awk", job_output])
    parts = []
    for sc in scenarios:
        try:
            with open(f"{sc.work}/run.out") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            lines = []
        try:
            with open(f"{sc.work}/run.rc") as f:
                status = int(f.read())
        except (FileNotFoundError, ValueError):
            status = None
        parts.append((lines, status))
    return parts


def one(build, config, fmt):
    """A scenario alone: prepare, its own job, check (the output as ever)."""
    sc = Scenario(build, config, fmt)
    try:
        sc.prepare()
        with open(f"{sc.work}/run.log", "w+") as log:
            rc = launch(build, [sc.run_yaml], log)
            log.seek(0)
            out = log.read().splitlines()
        if rc != 0:
            print("\n".join(out), flush=True)
            say("FAIL: refit-launch exited non-zero")
            sys.exit(1)
        print(out[-1] if out else "", flush=True)
        sys.exit(sc.check())
    finally:
        sc.remove()


def batch(build, fmt, configs):
    """Many scenarios in one MPI job (a job's start-up paid once, not once
    each): every checkpoint made, one job refits them all one after another,
    each dump checked; one line per scenario, ok or FAIL with its seed and
    the command that runs it alone."""
    scenarios = [Scenario(build, c, fmt) for c in configs]
    try:
        for sc in scenarios:
            sc.prepare()
        job_output = f"{scenarios[0].work}/batch.log"
        with open(job_output, "w") as log:
            rc = launch(build, [sc.run_yaml for sc in scenarios], log)
        failed = 0
        for sc, (lines, status) in zip(scenarios, sections(job_output, scenarios)):
            if status == 0:
                print(lines[-1] if lines else "", flush=True)
                if sc.check() == 0:
                    say(f"ok: {sc.name()} (source.seed {sc.seed}, checkpoint {sc.dtype})")
                    continue
                why = "a generator byte differs from the vLLM reference"
            else:
                print("\n".join(lines), flush=True)
                why = ("refit-run exited with status %d" % status if status is not None else
                       "the job (exit status %d) did not run it to its end" % rc)
            failed += 1
            say(f"FAIL: {sc.name()} (source.seed {sc.seed}, checkpoint {sc.dtype}): {why}; "
                f"to run it alone with the same seed: {sc.rerun()}")
        if rc != 0 and not failed:
            with open(job_output) as f:
                print(f.read(), end="", flush=True)
            say(f"FAIL: the job exited with status {rc}")
            failed = 1
        say(f"{len(scenarios) - failed} of {len(scenarios)} scenarios passed")
        sys.exit(1 if failed else 0)
    finally:
        for sc in scenarios:
            sc.remove()


def main():
    args = sys.argv[1:]
    # ctest's timeout sends SIGTERM: leave through the cleanup.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if len(args) >= 4 and args[1] == "--batch" and args[2] in ("hdf5", "safetensors"):
        batch(os.path.abspath(args[0]), args[2], args[3:])
    if len(args) not in (2, 3) or args[2:] not in ([], ["hdf5"], ["safetensors"]):
        sys.exit("usage: run_reference.py BUILD_DIR CONFIG [safetensors]\n"
                 "       run_reference.py BUILD_DIR --batch hdf5|safetensors CONFIG...")
    one(os.path.abspath(args[0]), args[1], args[2] if len(args) == 3 else "hdf5")


if __name__ == "__main__":
    main()

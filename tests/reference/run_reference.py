#!/usr/bin/env python3
"""run_reference.py BUILD_DIR CONFIG [safetensors]

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


def main():
    if len(sys.argv) not in (3, 4) or sys.argv[3:] not in ([], ["hdf5"], ["safetensors"]):
        sys.exit("usage: run_reference.py BUILD_DIR CONFIG [safetensors]")
    build, config = os.path.abspath(sys.argv[1]), sys.argv[2]
    fmt = sys.argv[3] if len(sys.argv) == 4 else "hdf5"
    seed = os.environ.get("REFIT_REFERENCE_SEED") or int.from_bytes(os.urandom(4), "little")
    seed = int(seed)
    dtype = os.environ.get("REFIT_REFERENCE_DTYPE") or ("bf16", "f32", "f16")[seed % 3]
    say(f"{config} with source.seed {seed}, checkpoint {dtype} "
        f"(REFIT_REFERENCE_SEED={seed} repeats it)")
    work = tempfile.mkdtemp()
    # ctest's timeout sends SIGTERM: leave through the cleanup below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        cfg, steps = write_configs(config, work, seed, fmt)
        # refit-run refits versions 1..steps and an HDF5 checkpoint holds one
        # version that every refit reads, so the dump (version `steps`) holds
        # the checkpoint's values whatever version they were made for; making
        # them for version `steps` keeps the version attributes of checkpoint
        # and dump equal.
        step("refit-ckpt", [f"{build}/runtime/refit-ckpt", f"{work}/ckpt.yaml",
                            f"{work}/ckpt.h5", "--version", str(steps), "--dtype", dtype])
        add_mtp_layer(cfg["model"], f"{work}/ckpt.h5")
        if fmt == "safetensors":
            shards = 3 if seed % 2 else 1
            write_safetensors.write(f"{work}/ckpt.h5", f"{work}/ckpt-st", shards)
            say(f"safetensors checkpoint, {shards} file(s)")
        with open(f"{work}/run.log", "w+") as log:
            rc = subprocess.run([f"{ROOT}/launch/refit-launch", "--build-dir", build,
                                 f"{work}/run.yaml"], stdout=log, stderr=subprocess.STDOUT
                                ).returncode
            log.seek(0)
            out = log.read().splitlines()
        if rc != 0:
            print("\n".join(out), flush=True)
            say("FAIL: refit-launch exited non-zero")
            sys.exit(1)
        print(out[-1] if out else "", flush=True)
        sys.exit(check_dump.check(f"{work}/run.yaml", f"{work}/ckpt.h5", f"{work}/dump.h5"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

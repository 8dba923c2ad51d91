#!/usr/bin/env bash
# Refit a fresh random checkpoint with the config's layout and check every
# generator byte against the independent vLLM reference (vllm_rules.py).
#   run_reference.sh BUILD_DIR CONFIG [safetensors]
# With `safetensors` the same weights are refitted from a Hugging Face
# safetensors checkpoint written by write_safetensors.py (the format's own
# rules, not refit's writer), one file or (odd seeds) three shards and an
# index, and the generator bytes are checked against the HDF5 weights.
# Each run draws a new source.seed and, from it, the checkpoint's element
# type (bf16, f32 or f16, so that the reader's conversions are exercised too)
# and prints both; REFIT_REFERENCE_SEED=N repeats a run and
# REFIT_REFERENCE_DTYPE overrides the element type. PYTHON names the interpreter (it needs numpy, h5py, PyYAML);
# by default the first of python3, /usr/bin/python3 that has them.
set -euo pipefail
build=$(cd "$1" && pwd) config=$2 format=${3:-hdf5}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

. "$here/../find_python.sh"
refit_find_python run_reference numpy h5py yaml || exit 1

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
seed=${REFIT_REFERENCE_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
dtypes=(bf16 f32 f16)
dtype=${REFIT_REFERENCE_DTYPE:-${dtypes[$((seed % 3))]}}
echo "run_reference: $config with source.seed $seed, checkpoint $dtype" \
     "(REFIT_REFERENCE_SEED=$seed repeats it)"

# Two copies of the config: one that makes the checkpoint from the seed, one
# that refits from that checkpoint and dumps the generator tensors.
steps=$("$python" - "$config" "$work" "$seed" "$format" <<'EOF'
import sys, yaml
config, work, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(config) as f:
    cfg = yaml.safe_load(f)
cfg["source"] = {"kind": "synthetic", "seed": seed}
with open(f"{work}/ckpt.yaml", "w") as f:
    yaml.safe_dump(cfg, f, sort_keys=False)
if sys.argv[4] == "safetensors":
    cfg["source"] = {"kind": "safetensors", "path": f"{work}/ckpt-st", "seed": seed}
else:
    cfg["source"] = {"kind": "hdf5", "path": f"{work}/ckpt.h5", "seed": seed}
cfg["dump"] = f"{work}/dump.h5"
with open(f"{work}/run.yaml", "w") as f:
    yaml.safe_dump(cfg, f, sort_keys=False)
print((cfg.get("refit") or {}).get("steps", 3))
EOF
)

# refit-run refits versions 1..steps and an HDF5 checkpoint holds one version
# that every refit reads, so the dump (version `steps`) holds the checkpoint's
# values whatever version they were made for; making them for version `steps`
# keeps the version attributes of checkpoint and dump equal.
"$build/runtime/refit-ckpt" "$work/ckpt.yaml" "$work/ckpt.h5" --version "$steps" --dtype "$dtype"
# A DeepSeek checkpoint holds its multi-token-prediction layer as
# model.layers.<num_layers> (num_nextn_predict_layers), which vLLM's main
# model skips by name and refit does not move: give the checkpoint one, of
# values the reference never reads.
"$python" - "$work/ckpt.yaml" "$work/ckpt.h5" <<'EOF'
import sys, h5py, numpy as np, yaml
m = yaml.safe_load(open(sys.argv[1]))["model"]
if m["family"] == "deepseek_v3":
    h, L = m["hidden_size"], m["num_layers"]
    with h5py.File(sys.argv[2], "a") as f:
        for rest, shape in (("enorm.weight", (h,)), ("hnorm.weight", (h,)),
                            ("eh_proj.weight", (h, 2 * h)), ("input_layernorm.weight", (h,)),
                            ("shared_head.norm.weight", (h,))):
            d = f.create_dataset(f"model.layers.{L}.{rest}", data=np.full(shape, 0x7fc0, np.uint16))
            d.attrs["dtype"] = "bfloat16"
        print(f"run_reference: MTP layer model.layers.{L} in the checkpoint")
EOF
if [ "$format" = safetensors ]; then
  "$python" "$here/write_safetensors.py" "$work/ckpt.h5" "$work/ckpt-st" --shards $((seed % 2 ? 3 : 1))
  echo "run_reference: safetensors checkpoint, $((seed % 2 ? 3 : 1)) file(s)"
fi
if ! "$root/launch/refit-launch" --build-dir "$build" "$work/run.yaml" >"$work/run.log" 2>&1; then
  cat "$work/run.log"
  echo "run_reference: FAIL: refit-launch exited non-zero"
  exit 1
fi
tail -n 1 "$work/run.log"
"$python" "$here/check_dump.py" "$work/run.yaml" "$work/ckpt.h5" "$work/dump.h5"

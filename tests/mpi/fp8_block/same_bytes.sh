#!/usr/bin/env bash
# Quantizing on the trainer must not change a byte: refit a config that sets
# refit.prequantize (or refit.delta) twice, as it is and with both removed
# (the generator then assembles and quantizes every tensor), each dumping its
# generator tensors, and require the two dumps to hold the same stores with
# the same bytes.
#   same_bytes.sh BUILD_DIR CONFIG
#   same_bytes.sh --prepare DIR BUILD_DIR CONFIG   (a batch: run_batch.sh)
#   same_bytes.sh --check DIR
# --prepare and --check run the steps apart, for a batch of scenarios in one
# job (tests/mpi/scenario.sh).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../scenario.sh"
. "$refit_root/tests/find_python.sh"

# DIR/trainer.yaml and DIR/generator.yaml: the config as it is, and without
# quantizing on the trainer; each dumps its generator tensors into DIR.
scenario_prepare() {
  local dir=$1 config=$3
  build=$(cd "$2" && pwd)
  refit_find_python same_bytes h5py numpy yaml || exit 1
  "$python" - "$config" "$dir" <<'PY'
import sys, yaml
config, work = sys.argv[1], sys.argv[2]
with open(config) as f:
    cfg = yaml.safe_load(f)
cfg.pop("verify", None)
for name, on_trainer in (("trainer", True), ("generator", False)):
    run = yaml.safe_load(yaml.safe_dump(cfg))
    if not on_trainer:
        for key in ("prequantize", "delta", "delta_full_every"):
            run["refit"].pop(key, None)
    run["dump"] = f"{work}/{name}.h5"
    with open(f"{work}/{name}.yaml", "w") as f:
        yaml.safe_dump(run, f, sort_keys=False)
PY
  printf '%s\n' "$dir/trainer.yaml" "$dir/generator.yaml" >"$dir/jobs"
}

# Both jobs exited 0, and their dumps hold the same stores, bit for bit.
scenario_check() {
  local dir=$1 side
  refit_find_python same_bytes h5py numpy yaml || exit 1
  for side in trainer generator; do
    if [ "$(cat "$dir/$side.rc")" -ne 0 ]; then
      cat "$dir/$side.out"
      echo "same_bytes: FAIL: the run quantizing on the $side failed"
      exit 1
    fi
  done
  "$python" - "$dir/trainer.h5" "$dir/generator.h5" <<'PY'
import sys
import h5py
import numpy as np

def stores(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, np.asarray(obj[()]).tobytes())
                     if isinstance(obj, h5py.Dataset) else None)
    return out

a, b = stores(sys.argv[1]), stores(sys.argv[2])
bad = sorted(set(a) ^ set(b)) + sorted(k for k in set(a) & set(b) if a[k] != b[k])
for k in bad[:20]:
    print(f"same_bytes: differs: {k}")
if bad or not a:
    print(f"same_bytes: FAIL: {len(bad)} of {len(set(a) | set(b))} stores differ")
    sys.exit(1)
print(f"same_bytes: ok: {len(a)} stores, bit for bit")
PY
}

refit_scenario_main "$@"

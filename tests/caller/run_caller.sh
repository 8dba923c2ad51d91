#!/usr/bin/env bash
# Run caller_refit.py on every rank of CONFIG's job through the project's
# launcher; pass only when every rank passed.
#   run_caller.sh BUILD_DIR CONFIG [--matrix] [--hdf5-reference]
#                 [caller_refit.py options]
# --matrix: CONFIG is a test layout with its own source (tests/mpi): it is
#   refitted from caller-owned Megatron-Core tensors instead.
# --hdf5-reference: the program writes its weights as a checkpoint with h5py
#   and refit verifies against it (reference.kind hdf5).
# --delta: the job runs with refit.delta: on and the program checks that
#   every refit after the first was a delta refit (pass --update-rate too:
#   with independent versions nearly every byte changes).
# PYTHON names the interpreter (it needs numpy, PyYAML and mpi4py); by
# default the first of python3, /usr/bin/python3 that has them.
set -uo pipefail
build=$(cd "$1" && pwd) config=$2
shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/../find_python.sh"
refit_find_python run_caller numpy yaml mpi4py || exit 1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=$work/out.log
matrix=0 hdf5=0 delta=0 pass=()
for a in "$@"; do
  case "$a" in
    --matrix) matrix=1 ;;
    --hdf5-reference) hdf5=1 ;;
    --delta) delta=1; pass+=("$a") ;;
    --torch-cuda)
      if ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
        2>/dev/null; then
        echo "run_caller: skipped: --torch-cuda needs torch with a GPU"
        exit 77
      fi
      pass+=("$a") ;;
    *) pass+=("$a") ;;
  esac
done
if [ $matrix -eq 1 ] || [ $hdf5 -eq 1 ] || [ $delta -eq 1 ]; then
  "$python" - "$config" "$work/job.yaml" "$matrix" "$hdf5" "$work/reference.h5" "$delta" <<'PY' || exit 1
import sys, yaml
src, dst, matrix, hdf5, ref, delta = sys.argv[1:]
cfg = yaml.safe_load(open(src))
if matrix == "1":
    cfg.setdefault("trainer", {})["layout"] = "megatron"
    cfg["source"] = {"kind": "caller"}
    cfg["verify"] = False
    cfg.pop("dump", None)
if hdf5 == "1":
    cfg["reference"] = {"kind": "hdf5", "path": ref}
    cfg["verify"] = True
if delta == "1":
    cfg.setdefault("refit", {})["delta"] = "on"
yaml.safe_dump(cfg, open(dst, "w"))
PY
  config=$work/job.yaml
  [ $hdf5 -eq 1 ] && pass+=(--hdf5-reference "$work/reference.h5")
fi
REFIT_LIBRARY="$build/runtime/librefit.so" \
  "$root/launch/refit-launch" --build-dir "$build" "$config" -- \
  "$python" "$here/caller_refit.py" "$config" "${pass[@]}" >"$out" 2>&1
rc=$?
cat "$out"
if [ $rc -ne 0 ] || ! grep -q "caller_refit: passed on every rank" "$out"; then
  echo "run_caller: FAIL (exit status $rc)"
  exit 1
fi
echo "run_caller: ok"

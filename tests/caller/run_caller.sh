#!/usr/bin/env bash
# Run caller_refit.py on every rank of CONFIG's job through the project's
# launcher; pass only when every rank passed.
#   run_caller.sh BUILD_DIR CONFIG [caller_refit.py options]
# PYTHON names the interpreter (it needs numpy, PyYAML and mpi4py); by
# default the first of python3, /usr/bin/python3 that has them.
set -uo pipefail
build=$(cd "$1" && pwd) config=$2
shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${PYTHON:-}
if [ -z "$python" ]; then
  for candidate in python3 /usr/bin/python3; do
    if "$candidate" -c 'import numpy, yaml, mpi4py' 2>/dev/null; then
      python=$(command -v "$candidate")
      break
    fi
  done
fi
if [ -z "$python" ]; then
  echo "run_caller: FAIL: no python3 with numpy, yaml and mpi4py (apt-get install" \
       "python3-numpy python3-yaml python3-mpi4py, or set PYTHON)"
  exit 1
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
REFIT_LIBRARY="$build/runtime/librefit.so" \
  "$root/launch/refit-launch" --build-dir "$build" "$config" -- \
  "$python" "$here/caller_refit.py" "$config" "$@" >"$out" 2>&1
rc=$?
cat "$out"
if [ $rc -ne 0 ] || ! grep -q "caller_refit: passed on every rank" "$out"; then
  echo "run_caller: FAIL (exit status $rc)"
  exit 1
fi
echo "run_caller: ok"

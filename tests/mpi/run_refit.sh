#!/usr/bin/env bash
# Run one refit job through the project's launcher and require both a zero
# exit status and the verification line (a job that prints "verified" but
# exits non-zero, or the reverse, fails).
#   run_refit.sh BUILD_DIR CONFIG [EXPECTED_LINE]
set -uo pipefail
build=$1 config=$2 expect=${3:-"refit-run: verified:"}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$root/launch/refit-launch" --build-dir "$build" "$config" >"$out" 2>&1
rc=$?
cat "$out"
if [ $rc -ne 0 ]; then
  echo "run_refit: FAIL: exit status $rc (expected 0)"
  exit 1
fi
if ! grep -qF -- "$expect" "$out"; then
  echo "run_refit: FAIL: output lacks '$expect'"
  exit 1
fi
echo "run_refit: ok"

#!/usr/bin/env bash
# Run one refit job through the project's launcher and require both a zero
# exit status and the verification line (a job that prints "verified" but
# exits non-zero, or the reverse, fails).
#   run_refit.sh [--gpu|--gpu-zc] BUILD_DIR CONFIG [EXPECTED_LINE]
# --gpu: the job on one GPU, every rank's tensors in device memory (transport
# ipc, zero_copy off, so that the generators' kernels run); exit 77 (skipped)
# without a GPU. --gpu-zc: the same with zero_copy on (generators read the
# trainers' tensors in place; the job fails where it cannot).
set -uo pipefail
gpu=0 zc=off
if [ "${1:-}" = --gpu ]; then gpu=1; shift; fi
if [ "${1:-}" = --gpu-zc ]; then gpu=1 zc=on; shift; fi
build=$1 config=$2 expect=${3:-"refit-run: verified:"}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=$(mktemp)
job=$(mktemp --suffix=.yaml)
trap 'rm -f "$out" "$job"' EXIT
if [ $gpu -eq 1 ]; then
  if ! nvidia-smi -L 2>/dev/null | grep "^GPU " >/dev/null; then
    echo "run_refit: skipped: needs a GPU, none visible"
    exit 77
  fi
  sed -e "/^  transport: /d" -e "/^  zero_copy: /d" \
    -e "s/^refit:\$/refit:\n  transport: ipc\n  zero_copy: $zc/" "$config" >"$job"
  config=$job
fi
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

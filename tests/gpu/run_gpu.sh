#!/usr/bin/env bash
# Run test_gpu_transport on NP ranks through the project's launcher.
#   run_gpu.sh BUILD_DIR NP [--dead-peer] -- TEST_ARGS...
# Normal runs need exit status 0 and the PASS line. --dead-peer runs (one rank
# kills itself) need a "dead-peer: PASS" line from each of the NP-1
# survivors and no FAIL; Open MPI is told to let the job go on when a rank
# dies (orte_enable_recovery), and the whole run is bounded by `timeout`, so a
# hang is a failure too. A SKIP line (no GPU) exits 77.
set -uo pipefail
build=$1 np=$2
shift 2
dead=0
if [ "${1:-}" = --dead-peer ]; then dead=1; shift; fi
[ "${1:-}" = -- ] && shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# No GPU: skipped before any job starts (as run_refit.sh does; a job that
# finds none costs its ranks' start-up for nothing).
. "$root/tests/gpus.sh"
if [ "$(refit_visible_gpus)" -eq 0 ]; then
  echo "run_gpu: skipped: no GPU (nvidia-smi -L lists none)"
  exit 77
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# NVLink multicast stays off on shared GPU machines, whatever the caller set.
export NCCL_NVLS_ENABLE=0
limit=150
[ $dead -eq 1 ] && export OMPI_MCA_orte_enable_recovery=1 && limit=60
timeout $limit "$root/launch/refit-launch" --np "$np" --build-dir "$build" \
  "$root/tests/gpu/gpu_link.yaml" -- "$build/tests/gpu/test_gpu_transport" "$@" \
  >"$out" 2>&1
rc=$?
cat "$out"
if grep -q "SKIP:" "$out"; then
  echo "run_gpu: skipped"
  exit 77
fi
if [ $rc -eq 124 ]; then
  echo "run_gpu: FAIL: the job did not end within $limit s (a hang)"
  exit 1
fi
if [ $dead -eq 1 ]; then
  pass=$(grep -o "dead-peer: PASS" "$out" | wc -l) # ranks interleave their lines
  fail=$(grep -o "dead-peer: FAIL" "$out" | wc -l)
  if [ "$fail" -ne 0 ] || [ "$pass" -ne $((np - 1)) ]; then
    echo "run_gpu: FAIL: $pass of $((np - 1)) survivors reported an error in time, $fail failed"
    exit 1
  fi
  echo "run_gpu: ok: all $pass survivors got an error within the deadline"
  exit 0
fi
if [ $rc -ne 0 ]; then
  echo "run_gpu: FAIL: exit status $rc (expected 0)"
  exit 1
fi
if ! grep -q "^test_gpu_transport: PASS" "$out"; then
  echo "run_gpu: FAIL: output lacks the PASS line"
  exit 1
fi
echo "run_gpu: ok"

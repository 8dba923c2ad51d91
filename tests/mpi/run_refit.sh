#!/usr/bin/env bash
# Run one refit job through the project's launcher and require both a zero
# exit status and the verification line (a job that prints "verified" but
# exits non-zero, or the reverse, fails).
#   run_refit.sh [--gpu|--gpu-zc] BUILD_DIR CONFIG [EXPECTED_LINE]
#   run_refit.sh --prepare DIR BUILD_DIR CONFIG [EXPECTED_LINE]   (a batch: run_batch.sh)
#   run_refit.sh --check DIR
# --gpu: the job on one GPU, every rank's tensors in device memory (transport
# ipc, zero_copy off, so that the generators' kernels run); exit 77 (skipped)
# without a GPU. --gpu-zc: the same with zero_copy on (generators read the
# trainers' tensors in place; the job fails where it cannot). --prepare and
# --check run the steps apart, for a batch of scenarios in one job
# (tests/mpi/scenario.sh).
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/scenario.sh"

# The arguments (see above) into gpu, zc, build, config and expect.
refit_args() {
  gpu=0 zc=off
  if [ "${1:-}" = --gpu ]; then gpu=1; shift; fi
  if [ "${1:-}" = --gpu-zc ]; then gpu=1 zc=on; shift; fi
  build=$1 config=$2 expect=${3:-"refit-run: verified:"}
}

# The config as it is, or on the GPU as --gpu and --gpu-zc say (DIR/job.yaml).
scenario_prepare() {
  local dir=$1
  shift
  refit_args "$@"
  if [ $gpu -eq 1 ]; then
    if [ "$(refit_visible_gpus)" -eq 0 ]; then
      echo "run_refit: skipped: needs a GPU, none visible"
      exit 77
    fi
    sed -e "/^  transport: /d" -e "/^  zero_copy: /d" \
      -e "s/^refit:\$/refit:\n  transport: ipc\n  zero_copy: $zc/" "$config" >"$dir/job.yaml"
    config=$dir/job.yaml
  fi
  echo "$config" >"$dir/jobs"
}

# The exit status and the verification line, from the job's output and
# status in DIR.
scenario_check() {
  local dir=$1 name out rc
  shift
  refit_args "$@"
  name=$(basename "$(head -1 "$dir/jobs")" .yaml)
  out=$dir/$name.out
  rc=$(cat "$dir/$name.rc")
  cat "$out"
  if [ "$rc" -ne 0 ]; then
    echo "run_refit: FAIL: exit status $rc (expected 0)"
    exit 1
  fi
  if ! grep -qF -- "$expect" "$out"; then
    echo "run_refit: FAIL: output lacks '$expect'"
    exit 1
  fi
  echo "run_refit: ok"
}

refit_scenario_main "$@"

#!/usr/bin/env bash
# Run caller_refit.py on every rank of one job through the project's
# launcher; pass only when every scenario printed that it passed, by name,
# and the job exited 0.
#   run_caller.sh BUILD_DIR CONFIG [caller_refit.py scenario options]
#   run_caller.sh BUILD_DIR --batch LIST
# The first form runs one scenario (named after CONFIG's file, without
# .yaml) on the ranks CONFIG needs. The second runs every scenario of LIST
# (NAME CONFIG OPTIONS a line, as caller_refit.py --batch reads it) in one
# job of as many ranks as the largest needs: the job's start-up (mpirun,
# MPI_Init, Python and its imports on every rank), which costs more CPU than
# most scenarios' refits, is paid once. A failing scenario ends the job and
# prints the first form's command that runs it alone, with its seed
# (REFIT_CALLER_SEED=S in front).
# Options handled here before the job starts:
# --torch-cuda: the test is skipped (exit status 77) without torch and a GPU.
# caller_refit.py handles the others, among them --matrix (CONFIG is a test
# layout with its own source, tests/mpi: it is refitted from caller-owned
# Megatron-Core tensors instead), --hdf5-reference (the program writes its
# weights as a checkpoint with h5py and refit verifies against it) and
# --delta (refit.delta: on, and every refit after the first must be a delta
# refit; pass --update-rate too: with independent versions nearly every
# byte changes).
# PYTHON names the interpreter (it needs numpy, PyYAML and mpi4py); by
# default the first of python3, /usr/bin/python3 that has them.
set -uo pipefail
build=$(cd "$1" && pwd)
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/../find_python.sh"
refit_find_python run_caller numpy yaml mpi4py || exit 1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=$work/out.log

if [ "${1:-}" = --batch ]; then
  [ $# -eq 2 ] || { echo "run_caller: FAIL: --batch takes one LIST file"; exit 1; }
  list=$2 program=(--batch "$list")
else
  list=$work/scenario.list program=("$@")
  # The scenario's name and config, for the checks below (its options may
  # hold words with spaces, which the program gets as they are).
  echo "$(basename "$1" .yaml) $1" >"$list"
fi
# Every scenario's name, and the ranks of the largest (refit-plan reads
# each config as refit does).
names=() np=0 biggest="" cuda=0
while read -r name config options; do
  case "$name" in '' | '#'*) continue ;; esac
  n=$("$build/runtime/refit-plan" --world-size "$config") || {
    echo "run_caller: FAIL: [$name] refit-plan cannot read $config"
    exit 1
  }
  [ "$n" -gt "$np" ] && np=$n biggest=$config
  case " $options " in *" --torch-cuda "*) cuda=1 ;; esac
  names+=("$name")
done <"$list"
[ ${#names[@]} -gt 0 ] || { echo "run_caller: FAIL: no scenario in $list"; exit 1; }
case " ${program[*]} " in *" --torch-cuda "*) cuda=1 ;; esac
# nvidia-smi first: where it lists no GPU, torch is not imported to learn so.
. "$root/tests/gpus.sh"
if [ $cuda -eq 1 ] && { [ "$(refit_visible_gpus)" -eq 0 ] ||
  ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
    2>/dev/null; }; then
  echo "run_caller: skipped: --torch-cuda needs torch with a GPU"
  exit 77
fi

# The output as it comes (tee), so that a job that hangs until the test's
# timeout still shows how far each scenario got.
REFIT_LIBRARY="$build/runtime/librefit.so" \
  "$root/launch/refit-launch" --no-recovery --build-dir "$build" --np "$np" "$biggest" -- \
  "$python" "$here/caller_refit.py" --build "$build" --work "$work" "${program[@]}" \
  2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
failed=() unfinished=()
for name in "${names[@]}"; do
  if grep -qF "caller_refit: [$name] failed" "$out"; then
    failed+=("$name")
  elif ! grep -qF "caller_refit: [$name] passed on every rank" "$out"; then
    unfinished+=("$name")
  fi
done
if [ $rc -ne 0 ] || [ ${#failed[@]} -gt 0 ] || [ ${#unfinished[@]} -gt 0 ]; then
  echo "run_caller: FAIL (exit status $rc): ${#failed[@]} of ${#names[@]} scenarios" \
       "failed: ${failed[*]:-none}; ${#unfinished[@]} did not finish: ${unfinished[*]:-none}"
  exit 1
fi
echo "run_caller: ok: ${#names[@]} scenarios passed: ${names[*]}"

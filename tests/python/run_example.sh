#!/usr/bin/env bash
# The Python example (examples/python/run.py: a torch trainer taking AdamW
# steps under Megatron-Core's names, an engine serving an MoE block from
# vLLM-named tensors) as a user runs it, through the project's launcher.
#   run_example.sh BUILD_DIR [--delta]
# Passes when every step's engine check passed (the MoE block from the
# engine's tensors equals the trainer's). --delta: the example's config
# with refit.delta: on and the trainer at lr 1e-5: step 1 must be a full
# refit and every later one a delta refit that sent fewer bytes.
set -uo pipefail
build=$(cd "$1" && pwd)
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/../find_python.sh"
refit_find_python run_example torch numpy yaml mpi4py || exit 1
delta=0
[ "${1:-}" = --delta ] && delta=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
config=$root/examples/python/moe.yaml extra=()
if [ $delta -eq 1 ]; then
  config=$work/moe_delta.yaml
  sed 's/^refit:$/refit:\n  delta: on/' "$root/examples/python/moe.yaml" >"$config"
  grep -q "^  delta: on" "$config" || { echo "run_example: FAIL: no refit section"; exit 1; }
  extra=(--lr 1e-5)
fi
steps=5
# This tree's package, not whichever one the machine's python finds first.
REFIT_LIBRARY="$build/runtime/librefit.so" PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" \
  "$root/launch/refit-launch" --build-dir "$build" "$config" -- \
  "$python" "$root/examples/python/run.py" "$config" --steps $steps "${extra[@]}" \
  >"$work/out" 2>&1
rc=$?
cat "$work/out"
fail() { echo "run_example: FAIL: $*"; exit 1; }
[ $rc -eq 0 ] || fail "exit status $rc"
checked=$(grep -c "MoE block vs trainer: max |diff| 0.00e+00" "$work/out")
[ "$checked" -eq $steps ] || fail "$checked of $steps engine checks found no difference"
if [ $delta -eq 1 ]; then
  grep -q "^train: step 1 was a full refit" "$work/out" || fail "step 1 was not a full refit"
  for n in $(seq 2 $steps); do
    line=$(grep "^train: step $n was a delta refit: rank 0 sent" "$work/out") ||
      fail "step $n was not a delta refit"
    set -- $line
    [ "${11}" -lt "${13}" ] 2>/dev/null || fail "step $n: a delta refit sent ${11} of ${13} bytes"
  done
fi
echo "run_example: ok"

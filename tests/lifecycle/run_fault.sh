#!/usr/bin/env bash
# One fault-injection job through the project's launcher, then assertions on
# what every rank reported.
#   run_fault.sh BUILD CONFIG MAX_SECONDS [--rows N] [--exit zero|nonzero]
#                [--expect TEXT]... [--reject TEXT]... [--verified N]...
#                [--gpus N] [--one-gpu]
# --rows N: exactly N refit rows, each "verified" or "aborted: kept version",
#           and never a mismatch (no mix of versions anywhere).
# --gpus N: a GPU variant: exit 77 (skipped) unless N GPUs are visible.
# --one-gpu: exit 77 unless exactly one GPU is visible (every rank then
#   shares it: the zero-copy tests).
# --verified N: refit N committed and verified (the job recovered from the
#           fault: later refits work on the same transports).
set -uo pipefail
build=$1 config=$2 max_s=$3
shift 3
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
expects=() rejects=() verified=() rows="" want_exit=nonzero gpus=0 one_gpu=0
while [ $# -gt 0 ]; do
  case "$1" in
    --expect) expects+=("$2"); shift 2 ;;
    --reject) rejects+=("$2"); shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --verified) verified+=("$2"); shift 2 ;;
    --gpus) gpus=$2; shift 2 ;;
    --one-gpu) gpus=1 one_gpu=1; shift ;;
    --exit) want_exit=$2; shift 2 ;;
    *) echo "run_fault: unknown argument $1"; exit 2 ;;
  esac
done
if [ "$gpus" -gt 0 ]; then
  . "$root/tests/gpus.sh"
  have=$(refit_visible_gpus)
  if [ "$have" -lt "$gpus" ]; then
    echo "run_fault: skipped: needs $gpus GPUs, $have visible"
    exit 77
  fi
  if [ "$one_gpu" -eq 1 ] && [ "$have" -ne 1 ]; then
    echo "run_fault: skipped: needs exactly one GPU (every rank on it), $have visible"
    exit 77
  fi
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s)
"$root/launch/refit-launch" --build-dir "$build" "$config" >"$out" 2>&1
rc=$?
elapsed=$(($(date +%s) - start))
grep -v "PMIX ERROR" "$out"
fail() { echo "run_fault: FAIL: $*"; exit 1; }
case "$want_exit" in
  zero) [ $rc -eq 0 ] || fail "exit status $rc, expected 0" ;;
  nonzero) [ $rc -ne 0 ] || fail "exit status 0, expected a failure status" ;;
esac
[ "$elapsed" -le "$max_s" ] || fail "took ${elapsed}s, more than ${max_s}s"
for e in "${expects[@]}"; do
  grep -qF -- "$e" "$out" || fail "output lacks '$e'"
done
for v in "${verified[@]}"; do
  grep -qE "^ +$v +$v .*verified\$" "$out" || fail "refit $v did not commit and verify"
done
for r in "${rejects[@]}"; do
  if grep -qF -- "$r" "$out"; then fail "output has '$r'"; fi
done
# Sanitizer builds: memory errors fail the test; leaks fail it when any frame
# of the leaking allocation is refit's own code: a refit_ function or one of
# its source files (Open MPI, and the CUDA runtime linked statically without
# symbols, keep memory until exit by design and are not ours to judge).
if grep -qE "ERROR: AddressSanitizer|runtime error:" "$out"; then
  fail "a sanitizer reported a memory error or undefined behaviour"
fi
if grep -q "ERROR: LeakSanitizer" "$out"; then
  ours=$(awk '/^(Direct|Indirect) leak/ {blk=1; mine=0; next}
              blk && /in refit_|(runtime|reshard|kernels)\/[A-Za-z0-9_\/]*\.(c|h|cu|cuh):[0-9]/ {mine=1}
              blk && /^$/ {if (mine) n++; blk=0}
              END {print n+0}' "$out")
  [ "$ours" -eq 0 ] || fail "$ours leaks allocated by refit code"
  echo "run_fault: leak check: no leak allocated by refit code"
fi
if [ -n "$rows" ]; then
  ok=$(grep -cE '^ +[0-9]+ +[0-9]+ .*(verified|aborted: kept version [0-9]+)$' "$out")
  [ "$ok" -eq "$rows" ] || fail "$ok good refit rows, expected $rows"
  if grep -q MISMATCH "$out"; then fail "a mismatch: mixed versions"; fi
fi
echo "run_fault: ok (${elapsed}s, exit $rc)"

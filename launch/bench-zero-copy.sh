#!/usr/bin/env bash
# Same-GPU colocated refit of Qwen3-30B-A3B (docs/benchmarks.md, issue 15):
# configs/qwen3-30b-a3b-disagg.yaml with both ranks on the one visible GPU,
# BF16 -> MXFP8 TRTLLM layouts, zero copy against the staged path.
#
#   launch/bench-zero-copy.sh BUILD_DIR OUT_DIR
#
# Runs: the copy ceiling (refit-bench-kernels), zero copy verified (3 refits, restore: full; 2 with digests off),
# then timed (6 refits: 1 warm-up + 5) with restore: none and full, with
# digests on and off, async mode (digests off), and the staged path
# (refit.zero_copy: off) timed with restore: none. Logs in OUT_DIR; the refit
# tables are printed.
set -uo pipefail
build=$1 out=$2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$out"
base=$root/configs/qwen3-30b-a3b-disagg.yaml
variant() { # name verify steps restore zero_copy digests mode
  local cfg=$out/$1.yaml
  sed -e "s/^verify: false.*/verify: $2/" -e "s/^  steps: 6/  steps: $3/" \
    -e "s/^  mode: sync/  mode: ${7:-sync}/" \
    -e "s/^  timeout_s: 300/  timeout_s: 60\n  restore: $4\n  zero_copy: $5\n  digests: ${6:-true}/" \
    "$base" >"$cfg"
  timeout 240 "$root/launch/refit-launch" --build-dir "$build" "$cfg" >"$out/$1.log" 2>&1
  echo "== $1: exit $?"
  grep -E "^ +refit|^ +[0-9]+ +[0-9]+ |zero-copy|verified|FAILED|error|memory" "$out/$1.log" | head -14
}
# The ceiling in the same run: device-to-device copy (the kernel benchmark's row).
timeout 240 "$build/kernels/refit-bench-kernels" >"$out/kernels.log" 2>&1
grep -E "^cudaMemcpy D2D \(GPU ceiling\)" "$out/kernels.log" || echo "ceiling: see $out/kernels.log"
variant zc-verify true 3 full on
variant zc-verify-nodigest true 2 none on false
variant zc-none false 6 none on
variant zc-full false 6 full on
variant zc-none-nodigest false 6 none on false
variant zc-full-nodigest false 6 full on false
variant zc-async-nodigest false 6 none on false async
variant staged-none false 6 none off

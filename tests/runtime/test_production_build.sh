#!/usr/bin/env bash
# A production build has no fault seam (CMake REFIT_TESTS off, the default
# build type, CUDA off: the seam is in no CUDA source). It builds one beside
# the test build and checks that:
#   - librefit.so and refit-run define none of the seam's functions and carry
#     none of its messages, where the test build's librefit.so has both (so
#     the check can see a seam);
#   - refit-plan refuses a config with refit.fault at its file:line:col;
#   - refit-run, given REFIT_FAULT and REFIT_ENABLE_FAULTS=1 for a kill,
#     warns that it is ignored and refits, verified.
#   test_production_build.sh TEST_BUILD_DIR C_COMPILER
set -uo pipefail
test_build=$1
cc=$2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=$test_build/production
fail() { echo "test_production_build: FAIL: $*"; exit 1; }

cmake -S "$root" -B "$dir" -DREFIT_TESTS=OFF -DREFIT_CUDA=OFF -DREFIT_FUZZ=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER="$cc" >"$dir.log" 2>&1 ||
  fail "configure failed: $(tail -20 "$dir.log")"
cmake --build "$dir" -j "$(nproc)" --target refit refit-run refit-plan >>"$dir.log" 2>&1 ||
  fail "build failed: $(tail -30 "$dir.log")"

# The seam's functions (inject.c, fault.c) and its messages.
seam_symbols='^refit_fault_(fires|act|hold|bucket|parse|select)$'
seam_text='fault seam: |injected error'
seam_in() { # FILE: prints what of the seam FILE has
  nm --defined-only "$1" | awk '{print $NF}' | grep -E "$seam_symbols"
  strings "$1" | grep -E "$seam_text"
}
test_lib=$test_build/runtime/librefit.so
[ -n "$(seam_in "$test_lib")" ] || fail "the test build's $test_lib shows no seam: the check cannot see one"
for f in "$dir/runtime/librefit.so" "$dir/runtime/refit-run"; do
  found=$(seam_in "$f")
  [ -z "$found" ] || fail "the production build's $f has the fault seam: $found"
done

config=$root/tests/lifecycle/fault_open_mpi_killed.yaml
out=$("$dir/runtime/refit-plan" "$config" 2>&1)
rc=$?
line=$(grep -n "fault:" "$config" | cut -d: -f1)
[ $rc -ne 0 ] && grep -q "$config:$line:[0-9]*: refit.fault: this build has no fault seam" <<<"$out" ||
  fail "refit-plan with refit.fault: exit $rc, expected a refusal at $config:$line: $out"

out=$(REFIT_ENABLE_FAULTS=1 REFIT_FAULT=phase=transfer,rank=0,action=kill \
  timeout -k 5 100 "$root/launch/refit-launch" --build-dir "$dir" \
  "$root/tests/lifecycle/basic.yaml" 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "refit-run with REFIT_FAULT exited $rc: $out"
grep -q "REFIT_FAULT is set but ignored: this build has no fault seam" <<<"$out" ||
  fail "refit-run did not say that REFIT_FAULT is ignored: $out"
grep -q "refit-run: verified: 3 refits" <<<"$out" || fail "refit-run did not verify: $out"
echo "test_production_build: ok (no seam in $dir; refit.fault refused, REFIT_FAULT ignored)"

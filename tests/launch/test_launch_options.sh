#!/usr/bin/env bash
# refit-launch's recovery switch: by default mpirun runs with recovery (a
# rank that dies leaves the others to report a lost peer); --no-recovery
# leaves Open MPI's default, under which the first rank that fails ends the
# job at once; srun refuses it.
#   test_launch_options.sh BUILD_DIR
set -uo pipefail
build=$1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
launch=("$root/launch/refit-launch" --build-dir "$build" --np 2)
config=$root/configs/demo.yaml
fail() { echo "test_launch_options: FAIL: $*"; exit 1; }

out=$("${launch[@]}" --dry-run "$config" 2>&1) || fail "--dry-run exited $?: $out"
grep -q -- "--enable-recovery" <<<"$out" || fail "the default command lacks --enable-recovery: $out"
out=$("${launch[@]}" --no-recovery --dry-run "$config" 2>&1) || fail "--no-recovery --dry-run exited $?: $out"
grep -q "mpirun" <<<"$out" || fail "no mpirun command: $out"
if grep -q -- "--enable-recovery" <<<"$out"; then fail "--no-recovery still asks for recovery: $out"; fi
out=$("${launch[@]}" --launcher srun --no-recovery --dry-run "$config" 2>&1)
rc=$?
[ $rc -eq 2 ] && grep -q -- "--no-recovery applies to mpirun only" <<<"$out" ||
  fail "srun with --no-recovery: exit $rc, expected 2 and a message: $out"

# A rank that fails ends the job: its peer, which would sleep for a minute,
# is stopped, and the job's status is a failure.
start=$SECONDS
out=$(timeout -k 5 50 "${launch[@]}" --no-recovery "$config" -- \
  sh -c 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exit 3; fi; sleep 60' 2>&1)
rc=$?
took=$((SECONDS - start))
[ $rc -ne 0 ] || fail "the job of a failed rank exited 0: $out"
[ $rc -ne 124 ] && [ $rc -ne 137 ] && [ $took -lt 40 ] ||
  fail "the job went on for ${took} s after a rank failed (exit $rc): $out"
echo "test_launch_options: ok (a failed rank ended its --no-recovery job in ${took} s, exit $rc)"

#!/usr/bin/env bash
# Many test scenarios in one MPI job: a job's start-up and teardown (mpirun,
# every rank's exec, MPI_Init and MPI_Finalize, under ASan seconds of CPU)
# paid once for all of them instead of once each.
#   run_batch.sh BUILD_DIR -- NAME SCRIPT ARGS... [-- NAME SCRIPT ARGS...]...
# Each scenario is NAME and the command that runs it alone, `SCRIPT ARGS...`
# (run_refit.sh, delta/run_delta.sh or fp8_block/same_bytes.sh: scripts
# sourcing scenario.sh). Every scenario is prepared (SCRIPT --prepare), then
# one job of the largest world size among their configs runs them all, one
# after another (refit-run CONFIG...), then each scenario's checks run on its
# part of the output (SCRIPT --check), cut at the line with which refit-run
# opens each config. Prints one line per scenario: ok or FAIL, its name and
# its source.seed; for a failure also the check's output and the command
# that runs the scenario alone with the same seed. Exits 0 only if every
# scenario passed.
#
# Only scenarios that exit 0 and need no GPU belong here: one that expects a
# refit to fail, injects a fault or kills a rank runs alone (a lost peer
# ends the job and with it every scenario after it). Lines that other ranks
# write to stderr may reach the output after the next config's opening line;
# the checks of a scenario that passes do not read them.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$1
shift
[ "${1:-}" = -- ] || { echo "run_batch: usage: run_batch.sh BUILD_DIR -- NAME SCRIPT ARGS..."; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The scenarios: names[i], and their commands in $work/i/command (NUL-separated).
names=()
while [ $# -gt 0 ]; do
  shift # the --
  i=${#names[@]}
  names+=("$1")
  shift
  mkdir "$work/$i"
  : >"$work/$i/command"
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    printf '%s\0' "$1" >>"$work/$i/command"
    shift
  done
done

# Prepare each; every job of every scenario, in order, into jobs[], and
# which scenario each job belongs to into owner[].
jobs=() owner=() prepared=()
for i in "${!names[@]}"; do
  mapfile -d '' -t command <"$work/$i/command"
  if "${command[0]}" --prepare "$work/$i" "${command[@]:1}" >"$work/$i/prepare.log" 2>&1; then
    prepared[i]=1
    mapfile -t scenario_jobs <"$work/$i/jobs"
    for job in "${scenario_jobs[@]}"; do
      jobs+=("$job")
      owner+=("$i")
    done
  else
    prepared[i]=0
  fi
done

# One job runs them all; its output is cut into the jobs' own, each into
# its scenario's directory as NAME.out, with the config's exit status in
# NAME.rc (refit-run's closing line of each config).
rc=0
if [ ${#jobs[@]} -gt 0 ]; then
  # A config refit-plan refuses is refit-run's to report, in its part.
  np=$("$build/runtime/refit-plan" --world-size "${jobs[@]}" 2>/dev/null) || np=""
  "$root/launch/refit-launch" ${np:+--np "$np"} --build-dir "$build" "${jobs[0]}" -- \
    "$build/runtime/refit-run" "${jobs[@]}" >"$work/job.out" 2>&1
  rc=$?
  for k in "${!jobs[@]}"; do
    printf '%s\t%s\n' "${jobs[k]}" "$work/${owner[k]}/$(basename "${jobs[k]}" .yaml)"
  done >"$work/sections"
  awk -v sections="$work/sections" -f "$root/tests/split_batch.awk" "$work/job.out"
fi

# Check each scenario on its part of the output.
failed=0
for i in "${!names[@]}"; do
  dir=$work/$i
  seed=$(cat "$dir/seed" 2>/dev/null)
  why=""
  if [ "${prepared[i]}" -eq 0 ]; then
    why="its preparation failed"
    cp "$dir/prepare.log" "$dir/check.log"
  else
    missing=""
    mapfile -t scenario_jobs <"$dir/jobs"
    for job in "${scenario_jobs[@]}"; do
      [ -e "$dir/$(basename "$job" .yaml).rc" ] || missing="$job"
    done
    if [ -n "$missing" ]; then
      why="the job (exit status $rc) did not run $missing to its end"
      : >"$dir/check.log"
    else
      mapfile -d '' -t command <"$dir/command"
      "${command[0]}" --check "$dir" >"$dir/check.log" 2>&1 || why=$(tail -1 "$dir/check.log")
    fi
  fi
  seconds=$(cat "$dir"/*.seconds 2>/dev/null | awk '{ s += $1 } END { printf "%.1f", s }')
  if [ -z "$why" ]; then
    echo "run_batch: ok: ${names[i]} (${seed:+source.seed $seed, }${seconds} s)"
    continue
  fi
  failed=$((failed + 1))
  echo "run_batch: FAIL: ${names[i]}${seed:+ (source.seed $seed)}: $why"
  sed 's/^/    /' "$dir/check.log"
  echo "  to run it alone with the same seed: $(cat "$dir/rerun" 2>/dev/null)"
done
if [ $failed -gt 0 ] || [ $rc -ne 0 ]; then
  echo "run_batch: the job's output outside its configs' parts:"
  awk -v n=${#jobs[@]} '/^refit-run: config [0-9]+ of [0-9]+: /{ inside = 1 }
       !inside { print "    " $0 }
       /^refit-run: config [0-9]+ of [0-9]+ ended: / && $3 == n { inside = 0 }' "$work/job.out"
fi
if [ $failed -gt 0 ]; then
  echo "run_batch: FAIL: $failed of ${#names[@]} scenarios failed"
  exit 1
fi
if [ $rc -ne 0 ]; then
  echo "run_batch: FAIL: every scenario passed, but the job exited $rc"
  exit 1
fi
echo "run_batch: ok: ${#names[@]} scenarios in one job of ${np:-?} ranks"

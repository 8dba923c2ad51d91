#!/usr/bin/env bash
# One delta-refit job (refit.delta) through the project's launcher, with a
# fresh random source.seed, then assertions on what each refit was and sent.
#   run_delta.sh BUILD CONFIG [--refit N full|delta|aborted|damaged]... [--max F]
#                [--transport T] [--as-delta STEPS] [--gpus N] [--gpu]
#                [--lengths-ahead] [--random-faults] [--reference] [--seed S]
#   run_delta.sh --prepare DIR BUILD CONFIG [options]   (a batch: run_batch.sh)
#   run_delta.sh --check DIR
# Every refit row must be verified (or, where --refit N aborted says so,
# aborted with the previous version kept and verified; --refit N damaged: it
# committed and the verify fault seam damaged runtime storage before its
# verification, which must find exactly that: MISMATCH); --refit N full|delta
# requires refit N's wire line (refit-run: wire) to name that kind; every
# delta refit must send at most F (default 0.5) of a full refit's bytes, and
# every full one exactly a full refit's. --transport overrides refit.transport.
# --as-delta STEPS turns a config of the MPI matrix into a delta job: delta:
# on, STEPS refits, source.update_rate 1e-3. Generators apply deltas in
# place: every delta refit must write exactly the runtime bytes it found
# changed, some and fewer than a full refit writes, and every full refit
# some (the wire line's "generators: C bytes changed, W written"), on host
# and GPU generators alike. --gpus N: exit 77 (skipped) unless N GPUs are
# visible. --gpu: the job on one GPU, device memory over transport ipc with
# zero_copy: off (--gpus 1 --transport ipc). --lengths-ahead: refit.lengths_ahead:
# true (every exchange through the lengths wrapper, as delta refits over
# NCCL run), and the session must name its transport "<name>+lengths".
# --random-faults: the config injects faults at random (refit.fault with a
# probability): each refit either commits and verifies or aborts keeping
# the last committed version (verified); a refit is full exactly when it is
# the first or the one before it aborted, delta otherwise; the job must have
# had some of each: aborted, full after an abort, delta.
# --reference: the job also dumps its generator tensors after the last
# refit, and every byte of the dump is checked against the independent vLLM
# reference (tests/reference/check_dump.py, vllm_rules.py) from a checkpoint
# of the last version's synthetic values (refit-ckpt): the bytes that many
# refits, most of them delta ones, left in place are the reference's.
# --seed S: source.seed S instead of a fresh one (to repeat a run). --prepare
# and --check run the steps apart, for a batch of scenarios in one job
# (tests/mpi/scenario.sh).
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../scenario.sh"

# The arguments (see above) into build, config and the options' variables.
delta_args() {
  build=$1 config=$2
  shift 2
  kinds=() max=0.5 transport="" as_delta="" gpus=0 zero_copy_off=0 lengths_ahead=0 random=0
  reference=0 seed=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --refit) kinds+=("$2 $3"); shift 3 ;;
      --max) max=$2; shift 2 ;;
      --transport) transport=$2; shift 2 ;;
      --as-delta) as_delta=$2; shift 2 ;;
      --gpus) gpus=$2; shift 2 ;;
      --gpu) gpus=1 transport=ipc zero_copy_off=1; shift ;;
      --lengths-ahead) lengths_ahead=1; shift ;;
      --random-faults) random=1; shift ;;
      --reference) reference=1; shift ;;
      --seed) seed=$2; shift 2 ;;
      *) echo "run_delta: unknown argument $1"; exit 2 ;;
    esac
  done
}

# DIR/job.yaml: the config with a fresh seed (or --seed's) and the options'
# edits.
scenario_prepare() {
  local dir=$1
  shift
  delta_args "$@"
  if [ "$gpus" -gt 0 ]; then
    have=$(refit_visible_gpus)
    if [ "$have" -lt "$gpus" ]; then
      echo "run_delta: skipped: needs $gpus GPUs, $have visible"
      exit 77
    fi
  fi
  if [ -z "$seed" ]; then
    seed=$(( (RANDOM << 15 | RANDOM) + 1 ))
    printf '%q ' "$refit_scenario_script" "$@" --seed "$seed" >"$dir/rerun"
  fi
  echo "$seed" >"$dir/seed"
  sed "s/^  seed: .*/  seed: $seed/" "$config" >"$dir/job.yaml"
  if [ -n "$as_delta" ]; then
    sed -i -e "s/^  steps: .*/  steps: $as_delta/" -e "s/^\(  seed: .*\)/\1\n  update_rate: 1.0e-3/" \
      -e "s/^refit:\$/refit:\n  delta: on/" "$dir/job.yaml"
  fi
  if [ -n "$transport" ]; then
    sed -i -e "/^  transport: /d" -e "s/^refit:$/refit:\n  transport: $transport/" "$dir/job.yaml"
  fi
  if [ $zero_copy_off -eq 1 ]; then
    sed -i -e "/^  zero_copy: /d" -e "s/^refit:$/refit:\n  zero_copy: off/" "$dir/job.yaml"
  fi
  if [ $lengths_ahead -eq 1 ]; then
    sed -i -e "/^  lengths_ahead: /d" -e "s/^refit:$/refit:\n  lengths_ahead: true/" "$dir/job.yaml"
  fi
  if [ $reference -eq 1 ]; then
    . "$refit_root/tests/find_python.sh"
    refit_find_python run_delta numpy h5py yaml || exit 1
    sed -i -e "/^dump: /d" "$dir/job.yaml"
    echo "dump: $dir/dump.h5" >>"$dir/job.yaml"
  fi
  echo "$dir/job.yaml" >"$dir/jobs"
  echo "run_delta: source.seed $seed${transport:+, transport $transport}"
}

# What each refit of DIR/job.yaml was and sent, from DIR/job.out and DIR/job.rc.
scenario_check() {
  local dir=$1
  shift
  delta_args "$@"
  seed=$(cat "$dir/seed")
  out="$dir/job.out"
  rc=$(cat "$dir/job.rc")
  grep -v "PMIX ERROR" "$out"
  fail() { echo "run_delta: FAIL (seed $seed): $*"; exit 1; }
  steps=$(sed -n 's/^  steps: *//p' "$dir/job.yaml")
  aborted=0 damaged=0
  for k in "${kinds[@]}"; do
    [ "${k#* }" = aborted ] && aborted=1
    [ "${k#* }" = damaged ] && damaged=$((damaged + 1))
  done
  if [ $random -eq 1 ]; then
    # The refits' outcomes are drawn: name each one from its row.
    [ $rc -ne 0 ] || grep -qE " aborted: kept version " "$out" ||
      fail "no refit aborted: the random faults did not fire (raise the probability)"
    kinds=() prev=verified kept=0
    for n in $(seq 1 "$steps"); do
      if grep -qE "^ +$n +$n .*aborted: kept version $kept\$" "$out"; then
        kinds+=("$n aborted")
        prev=aborted
      else
        [ "$n" -eq 1 ] || [ "$prev" = aborted ] && kinds+=("$n full") || kinds+=("$n delta")
        prev=verified kept=$n
      fi
    done
    echo "run_delta: refits as drawn: ${kinds[*]}"
    for want in aborted delta; do
      # grep reads all of its input (no -q): under pipefail an early exit
      # would fail printf with SIGPIPE and the pipeline with it.
      printf '%s\n' "${kinds[@]}" | grep " $want\$" >/dev/null ||
        fail "no $want refit among the drawn ones"
    done
    printf '%s\n' "${kinds[@]}" | grep -E "^([2-9]|[1-9][0-9]+) full\$" >/dev/null ||
      fail "no full refit after an aborted one among the drawn ones"
    aborted=1
  fi
  if [ $aborted -eq 0 ] && [ $damaged -eq 0 ]; then
    [ $rc -eq 0 ] || fail "exit status $rc, expected 0"
    grep -qF "refit-run: verified: $steps refits" "$out" || fail "not every refit verified"
  else
    [ $rc -ne 0 ] || fail "exit status 0 with a refit expected to abort"
  fi
  rows_re="^ +[0-9]+ +[0-9]+ .*MISMATCH\$"
  [ "$(grep -cE "$rows_re" "$out")" -eq $damaged ] &&
    ! grep -vE "$rows_re" "$out" | grep MISMATCH >/dev/null ||
    fail "a generator byte differs from the reference"
  if [ $lengths_ahead -eq 1 ]; then
    grep -qE "transport [a-z+]+\+lengths" "$out" || fail "the session did not name a +lengths transport"
  fi
  kept=0 # the last committed version
  for n in $(seq 1 "$steps"); do
    want=delta
    [ "$n" -eq 1 ] && want=full
    for k in "${kinds[@]}"; do
      [ "${k% *}" = "$n" ] && want=${k#* }
    done
    if [ "$want" = aborted ]; then
      grep -qE "^ +$n +$n .*aborted: kept version $kept\$" "$out" ||
        fail "refit $n did not abort keeping version $kept"
      [ "$kept" -eq 0 ] || grep -qF "runtime storage holds version $kept: verified bit for bit" \
        "$out" || grep -qF "POISONED" "$out" || fail "refit $n: the kept version was not verified"
      continue
    fi
    if [ "$want" = damaged ]; then
      grep -qE "^ +$n +$n .*MISMATCH\$" "$out" ||
        fail "refit $n: the damage the verify seam made was not found"
      kept=$n
      continue
    fi
    kept=$n
    grep -qE "^ +$n +$n .*verified\$" "$out" || fail "refit $n did not commit and verify"
    line=$(grep -E "^refit-run: wire: refit $n (full|delta):" "$out")
    [ -n "$line" ] || fail "refit $n has no wire line"
    set -- $line
    kind=${5%:} sent=$6 full=$8 changed=${16} written=${19}
    full_written=${full_written:-}
    [ "$kind" = full ] && full_written=$written
    [ "$kind" = "$want" ] || fail "refit $n was a $kind refit, expected $want"
    if [ "$kind" = full ]; then
      [ "$sent" = "$full" ] || fail "full refit $n sent $sent bytes, a full refit is $full"
      [ "$written" -gt 0 ] 2>/dev/null || fail "full refit $n wrote $written runtime bytes"
    else
      awk -v s="$sent" -v f="$full" -v m="$max" 'BEGIN { exit !(f > 0 && s <= m * f) }' ||
        fail "delta refit $n sent $sent of $full bytes, more than $max of a full refit"
      [ "$written" = "$changed" ] ||
        fail "delta refit $n wrote $written runtime bytes, it found $changed changed"
      awk -v w="$written" -v f="${full_written:-0}" 'BEGIN { exit !(w > 0 && w < f) }' ||
        fail "delta refit $n wrote $written runtime bytes, a full refit ${full_written:-?}"
    fi
  done
  if [ $reference -eq 1 ]; then
    . "$refit_root/tests/find_python.sh"
    refit_find_python run_delta numpy h5py yaml || exit 1
    "$build/runtime/refit-ckpt" "$dir/job.yaml" "$dir/ckpt.h5" --version "$kept" >/dev/null ||
      fail "refit-ckpt of version $kept"
    "$python" "$refit_root/tests/reference/check_dump.py" "$dir/job.yaml" "$dir/ckpt.h5" \
      "$dir/dump.h5" || fail "the dump of version $kept differs from the vLLM reference"
  fi
  echo "run_delta: ok"
}

refit_scenario_main "$@"

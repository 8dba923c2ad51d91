# Sourced by the test scripts whose scenarios also run batched, many in one
# MPI job (run_batch.sh): a scenario is prepared, its jobs run, and its
# output checked, as three steps that can run apart. A script defines
#   scenario_prepare DIR ARGS...  name the configs of its jobs in DIR/jobs,
#                                 one path a line, in order, each NAME.yaml
#                                 with a NAME of its own (written into DIR
#                                 where the scenario edits them); ARGS are
#                                 the script's own arguments; sets $build,
#                                 the build directory they name
#   scenario_check DIR ARGS...    judge each job NAME.yaml from its output
#                                 DIR/NAME.out and exit status DIR/NAME.rc:
#                                 print the verdict, exit 0 or 1
# and ends with `refit_scenario_main "$@"`, which gives it three modes:
#   SCRIPT ARGS...                alone: prepare in a temporary directory,
#                                 launch each job on its own, check
#   SCRIPT --prepare DIR ARGS...  prepare only; DIR/args keeps ARGS for the
#                                 check, DIR/seed the source.seed, DIR/rerun
#                                 the command that runs the scenario alone
#                                 with the same seed
#   SCRIPT --check DIR            check only, once DIR's jobs ran
# A scenario whose seed is drawn writes its own DIR/seed and DIR/rerun in
# scenario_prepare (run_delta.sh; $refit_scenario_script is the script's
# path); the defaults are the first job's seed and the command as given.

# Launch one job of a scenario alone: NAME.yaml through the project's
# launcher, its output in DIR/NAME.out and its exit status in DIR/NAME.rc.
refit_scenario_launch() {
  local dir=$1 job=$2 name rc=0
  name=$(basename "$job" .yaml)
  "$refit_root/launch/refit-launch" --build-dir "$build" "$job" >"$dir/$name.out" 2>&1 ||
    rc=$?
  echo $rc >"$dir/$name.rc"
}

refit_scenario_main() {
  local dir
  case "${1:-}" in
    --prepare)
      dir=$2
      shift 2
      printf '%q ' "$@" >"$dir/args"
      scenario_prepare "$dir" "$@" || exit
      [ -s "$dir/jobs" ] || { echo "$(basename "$0"): no job prepared in $dir"; exit 1; }
      if [ ! -e "$dir/seed" ]; then
        sed -n 's/^  seed: *//p' "$(head -1 "$dir/jobs")" | head -1 >"$dir/seed"
      fi
      if [ ! -e "$dir/rerun" ]; then
        printf '%q ' "$refit_scenario_script" "$@" >"$dir/rerun"
      fi
      ;;
    --check)
      dir=$2
      eval "set -- $(cat "$dir/args")"
      scenario_check "$dir" "$@"
      ;;
    *)
      dir=$(mktemp -d)
      # shellcheck disable=SC2064 # the directory as it is now
      trap "rm -rf '$dir'" EXIT
      scenario_prepare "$dir" "$@" || exit
      local jobs job
      mapfile -t jobs <"$dir/jobs"
      for job in "${jobs[@]}"; do
        refit_scenario_launch "$dir" "$job"
      done
      scenario_check "$dir" "$@"
      ;;
  esac
}

refit_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# refit_visible_gpus, for the scenarios that need GPUs.
. "$refit_root/tests/gpus.sh"
refit_scenario_script=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")

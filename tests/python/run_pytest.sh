#!/usr/bin/env bash
# Run a pytest file on every rank of CONFIG's job through the project's
# launcher; pass only when the launch exits 0 and every rank's pytest passed.
#   run_pytest.sh BUILD_DIR CONFIG TEST_FILE [refit-launch options]
# PYTHON names the interpreter; by default the first of python3,
# /usr/bin/python3 that has what the tests import.
set -uo pipefail
build=$(cd "$1" && pwd) config=$2 test=$3
shift 3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/python_env.sh" || exit 1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if [ "${1:-}" = --np ]; then
  np=$2
else
  np=$("$build/runtime/refit-plan" --world-size "$config") || exit 1
fi
REFIT_TEST_CONFIG=$config \
  "$root/launch/refit-launch" --build-dir "$build" "$@" "$config" -- \
  "$python" -m pytest -q -p no:cacheprovider --color=no "$test" >"$out" 2>&1
rc=$?
cat "$out"
passed=$(grep -oE "[0-9]+ passed in [0-9.]+s" "$out" | wc -l) # ranks interleave their lines
if [ $rc -ne 0 ] || [ "$passed" -ne "$np" ]; then
  echo "run_pytest: FAIL (exit status $rc, $passed of $np ranks passed)"
  exit 1
fi
echo "run_pytest: ok ($np ranks)"

#!/usr/bin/env bash
# Run a Python test of this directory with an interpreter that has numpy:
#   run_python.sh SCRIPT ARGS...
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../find_python.sh"
refit_find_python run_python numpy || exit 1
exec "$python" "$@"

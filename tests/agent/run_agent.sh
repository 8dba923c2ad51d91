#!/usr/bin/env bash
# Run tests/agent/test_agent.py against BUILD_DIR's refit-agent.
#   run_agent.sh BUILD_DIR [pytest args...]
# PYTHON names the interpreter; by default the first of python3,
# /usr/bin/python3 that imports what the tests need (torch for the client
# processes' tensors, numpy, yaml, pytest). The clients import no MPI.
set -uo pipefail
build=$(cd "$1" && pwd)
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../find_python.sh"
refit_find_python run_agent torch numpy yaml pytest || exit 1
cd "$here" && REFIT_BUILD_DIR=$build PYTHON=$python \
  "$python" -m pytest -q -p no:cacheprovider --color=no test_agent.py "$@"

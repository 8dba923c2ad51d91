#!/usr/bin/env bash
# Run tests/integrations/test_integrations.py against BUILD_DIR's refit-agent.
#   run_integrations.sh BUILD_DIR [pytest args...]
# PYTHON names the interpreter; by default the first of python3,
# /usr/bin/python3 that imports what the framework processes need (torch,
# numpy, yaml, pytest). No framework is installed: the tests bring stand-ins.
set -uo pipefail
build=$(cd "$1" && pwd)
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../find_python.sh"
refit_find_python run_integrations torch numpy yaml pytest || exit 1
cd "$here" && REFIT_BUILD_DIR=$build PYTHON=$python \
  "$python" -m pytest -q -p no:cacheprovider --color=no test_integrations.py "$@"

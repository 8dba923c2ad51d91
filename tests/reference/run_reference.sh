#!/usr/bin/env bash
# Refit a fresh random checkpoint with the config's layout and check every
# generator byte against the independent vLLM reference (vllm_rules.py):
#   run_reference.sh BUILD_DIR CONFIG [safetensors]
# The steps are run_reference.py's (which says what they are, and what
# REFIT_REFERENCE_SEED and REFIT_REFERENCE_DTYPE do). PYTHON names the
# interpreter (it needs numpy, h5py, PyYAML); by default the first of
# python3, /usr/bin/python3 that has them.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../find_python.sh"
refit_find_python run_reference numpy h5py yaml || exit 1
exec "$python" "$here/run_reference.py" "$@"

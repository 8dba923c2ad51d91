# Sourced by the Python test runners: picks the interpreter ($python) and
# points it at the package, the build's librefit.so and the test helpers.
python=${PYTHON:-}
if [ -z "$python" ]; then
  for candidate in python3 /usr/bin/python3; do
    if "$candidate" -c 'import numpy, yaml, mpi4py, torch, pytest' 2>/dev/null; then
      python=$(command -v "$candidate")
      break
    fi
  done
fi
if [ -z "$python" ]; then
  echo "python tests: FAIL: no python3 with numpy, yaml, mpi4py, torch and pytest" \
       "(launch/bootstrap.sh test installs them; or set PYTHON)"
  return 1
fi
export REFIT_LIBRARY="$build/runtime/librefit.so"
export PYTHONPATH="$root/python:$here${PYTHONPATH:+:$PYTHONPATH}"

# Sourced by the Python test runners: picks the interpreter ($python) and
# points it at the package, the build's librefit.so and the test helpers.
. "$here/../find_python.sh"
refit_find_python "python tests" numpy yaml mpi4py torch pytest || return 1
export REFIT_LIBRARY="$build/runtime/librefit.so"
export PYTHONPATH="$root/python:$here${PYTHONPATH:+:$PYTHONPATH}"

# Sourced by the test scripts that run Python: refit_find_python WHO MODULE...
# sets $python to $PYTHON, or else to the first of python3, /usr/bin/python3
# that imports every MODULE (a pyenv python3 on PATH may lack Debian's
# packages), and returns 1 with a message naming WHO when there is none.
refit_find_python() {
  local who=$1 candidate mods
  shift
  mods=$(IFS=,; echo "$*")
  python=${PYTHON:-}
  if [ -n "$python" ]; then
    return 0
  fi
  for candidate in python3 /usr/bin/python3; do
    if "$candidate" -c "import $mods" 2>/dev/null; then
      python=$(command -v "$candidate")
      return 0
    fi
  done
  echo "$who: FAIL: no python3 that imports $mods (launch/bootstrap.sh test" \
       "installs them; or set PYTHON)"
  return 1
}

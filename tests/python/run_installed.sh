#!/usr/bin/env bash
# The package as a user installs it, in fresh venvs (made with
# --system-site-packages, as launch/bootstrap.sh makes its own: Debian's
# numpy, torch, yaml and mpi4py), offline, with no refit variable set; the
# example refit (examples/python/run.py, an MPI refit.Session on two ranks)
# runs from another directory through the installed package:
#   1. `pip install --config-settings build-dir=BUILD .`: the package with
#      BUILD's librefit.so inside it (what bootstrap installs);
#   2. `pip wheel .` without the setting, that wheel installed in a second
#      venv: pure Python, finding librefit.so on the loader's path where
#      `cmake --install BUILD --prefix P` put it (P/lib on
#      LD_LIBRARY_PATH stands for ldconfig here).
# `pip wheel` with the setting must give a platform wheel carrying the
# library. The agent client from a venv: tests/agent (agent_processes_other).
#   run_installed.sh BUILD_DIR
set -uo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/../find_python.sh"
refit_find_python run_installed torch numpy yaml mpi4py || exit 1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "run_installed: FAIL: $*"; exit 1; }
# Nothing of the tree's: no package on the path, no library named.
unset PYTHONPATH REFIT_LIBRARY REFIT_BUILD_DIR
mkdir -p "$work/elsewhere" "$work/wheels" "$work/pure"
cp "$root/examples/python/moe.yaml" "$work/elsewhere/"

# The venvs' pip: where the system's pip is importable (python3-pip), the
# venv reaches it through --system-site-packages and installs into the
# venv's own site-packages (pip skips PEP 668's marker in a venv), so the
# venv is made without pip: ensurepip copying pip into each of the two
# venvs took 4 s of CPU apiece, and what is tested is the package pip
# installs, not pip. Without a system pip the venvs get their own.
no_pip=()
"$python" -m pip --version >/dev/null 2>&1 && no_pip=(--without-pip)
venv() { # venv DIR: a fresh venv that sees the system's packages
  "$python" -m venv --system-site-packages "${no_pip[@]}" "$1" || fail "python -m venv $1"
}
vpip() { # vpip VENV ARGS...: pip, offline
  "$1/bin/python" -m pip -q --disable-pip-version-check "${@:2}" --no-index ||
    fail "pip ${*:2}"
}
launch() { # launch VAR=VALUE... -- NP ARGS...: from another directory, the tree's launcher
  local vars=()
  while [ "$1" != -- ]; do vars+=("$1"); shift; done
  shift
  (cd "$work/elsewhere" && env "${vars[@]}" "$root/launch/refit-launch" --build-dir "$build" \
    --np "$@")
}
loads() { # loads VENV WANT [env...]: the venv's package loads librefit.so from WANT (a glob)
  local venv=$1 want=$2 got
  shift 2
  got=$(launch "$@" -- 1 moe.yaml -- "$venv/bin/python" -c \
        'import refit, refit._lib as l; print("package", refit.__file__); print("library", l.path)' \
        2>&1) || fail "the binding did not load: $got"
  [[ $got == *"package $venv/lib/python3"*"/site-packages/refit/__init__.py"* ]] ||
    fail "not the venv's package: $got"
  # shellcheck disable=SC2053 # WANT is a glob
  [[ $(grep "^library " <<<"$got") == "library "$want ]] || fail "library not $want: $got"
}
example() { # example VENV LABEL [env...]: the example's refit, 3 steps
  local venv=$1 label=$2 out=$work/$2.out
  shift 2
  launch "$@" -- 2 moe.yaml -- "$venv/bin/python" "$root/examples/python/run.py" moe.yaml \
    --steps 3 >"$out" 2>&1
  local rc=$?
  sed "s/^/$label: /" "$out"
  [ $rc -eq 0 ] || fail "$label: exit status $rc"
  [ "$(grep -c "MoE block vs trainer: max |diff| 0.00e+00" "$out")" -eq 3 ] ||
    fail "$label: not every engine check found no difference"
}

# 1. pip install ., the library inside.
venv "$work/venv"
vpip "$work/venv" install --config-settings "build-dir=$build" "$root"
loads "$work/venv" "$work/venv/lib/python3*/site-packages/refit/_native/librefit.so"
example "$work/venv" installed

# 2. pip wheel: with the setting a platform wheel with the library; without
# it a pure one, whose package finds the installed library.
vpip "$work/venv" wheel --no-deps -w "$work/wheels" --config-settings "build-dir=$build" "$root"
vpip "$work/venv" wheel --no-deps -w "$work/pure" "$root"
native=$(ls "$work/wheels"/refit-*-py3-none-linux_*.whl 2>/dev/null) ||
  fail "no platform wheel in $(ls "$work/wheels")"
[[ $("$python" -m zipfile -l "$native") == *"refit/_native/librefit.so "* ]] ||
  fail "$native carries no librefit.so"
pure=$(ls "$work/pure"/refit-*-py3-none-any.whl 2>/dev/null) || fail "no pure wheel"
[[ $("$python" -m zipfile -l "$pure") != *librefit* ]] || fail "$pure carries librefit.so"
cmake --install "$build" --prefix "$work/prefix" >/dev/null || fail "cmake --install"
venv "$work/venv2"
vpip "$work/venv2" install "$pure"
loads "$work/venv2" "$work/prefix/lib/librefit.so" LD_LIBRARY_PATH="$work/prefix/lib"
example "$work/venv2" wheel LD_LIBRARY_PATH="$work/prefix/lib"
echo "run_installed: ok"

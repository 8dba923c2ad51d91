#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine (as root, or with sudo):
#
#   launch/bootstrap.sh demo   install what is missing, build, run the demo refit
#   launch/bootstrap.sh test   install what is missing, build (normal and
#                              ASan/UBSan), run the whole test suite
#   launch/bootstrap.sh build  install what is missing and build only
#
# Builds go to build/ (and build-asan/ for the sanitizer run). REFIT_CUDA
# (AUTO, ON, OFF; default AUTO) is passed to CMake. The Python package goes
# into a venv, build/venv, with build/'s librefit.so inside it: after any of
# the three, `build/venv/bin/python` (or `. build/venv/bin/activate`) imports
# refit; nothing is installed outside the clone but Debian's packages.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
what=${1:-}
jobs=$(nproc)
# `test` runs each test in one of its two builds (docs/testing.md): the C
# tests (labels unit, mpi, fault, agent) under the sanitizers, the rest
# (Python, fuzz, integrations, Slurm) in the normal build, which also runs
# every unit test, one end-to-end refit per path (label fast) and every GPU
# test (skipped without a GPU; the sanitizer build has no CUDA).
# REFIT_TEST_BOTH=1 runs the C tests in the normal build as well: the whole
# suite in both builds, about twice the time.
both=${REFIT_TEST_BOTH:-0}

packages=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin
          libyaml-dev libjansson-dev libhdf5-dev libucx-dev libcmocka-dev libssl-dev
          python3 python3-numpy python3-mpi4py python3-venv)  # what `import refit` needs
# Test-only packages: a one-node Slurm cluster for tests/launch (label slurm),
# what the Python tests import (label python), and clang for the libFuzzer
# harnesses (label fuzz, built only where clang is found). Installed by `test`
# only; nothing at build or run time needs them.
test_packages=(slurmctld slurmd slurm-client munge clang libclang-rt-14-dev gdb
               python3-numpy python3-h5py python3-yaml python3-pytest python3-mpi4py
               python3-torch)

install_missing() { # install_missing [PACKAGE...] (default: packages)
  local missing=() want=("${@:-}")
  [ -n "${want[0]}" ] || want=("${packages[@]}")
  for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || {
      echo "bootstrap: missing packages ${missing[*]}; run as root or install them" >&2
      exit 1
    }
    sudo=sudo
  fi
  echo "bootstrap: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

# stage NAME COMMAND...: run COMMAND, then say how long it took (the CI log's
# breakdown of where the time goes; docs/testing.md).
stage() {
  local name=$1 start=$SECONDS rc=0
  shift
  "$@" || rc=$?
  echo "bootstrap: $name: $((SECONDS - start)) s"
  return $rc
}

build() { # build DIR [cmake args...]
  local dir=$1
  shift
  cmake -S "$root" -B "$dir" -DREFIT_CUDA="${REFIT_CUDA:-AUTO}" "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
}

# `import refit`: the package installed into the venv build/venv (made with
# --system-site-packages, so that Debian's numpy, mpi4py and torch serve it;
# Debian's own python3 takes no pip installs, PEP 668), with build/'s
# librefit.so inside it (pyproject.toml's backend, config setting
# build-dir). Offline, and again on every run: the venv then carries the
# library just built. A refit.pth an earlier bootstrap put into the system's
# python3 for this clone is removed.
install_python_package() {
  local venv=$root/build/venv site
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps \
    --force-reinstall --config-settings build-dir=build "$root"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  for site in $(/usr/bin/python3 -c 'import site; print(*site.getsitepackages())'); do
    if [ "$(cat "$site/refit.pth" 2>/dev/null)" = "$root/python" ]; then
      $sudo rm -f "$site/refit.pth"
    fi
  done
  echo "bootstrap: refit installed in $venv (librefit.so of build/ inside it)"
}

case "$what" in
  build)
    install_missing
    build build -DREFIT_TESTS=OFF
    install_python_package
    ;;
  demo)
    install_missing
    build build -DREFIT_TESTS=OFF
    install_python_package
    exec "$root/launch/refit-launch" --build-dir "$root/build" "$root/configs/demo.yaml"
    ;;
  test)
    stage "packages" install_missing
    stage "test packages" install_missing "${test_packages[@]}"
    # The sanitizer build runs the C tests. It is built without CUDA (the
    # suite it runs is host memory only), so that a machine without the CUDA
    # toolkit builds too: both configurations compile here; and without the
    # fuzz harnesses, which it does not run (label fuzz: the normal suite
    # runs them, under ASan and UBSan of their own). At -O1, as ASan's
    # documentation advises for speed (the planner's grid sweep: a fifth
    # less CPU than at -O0), with assertions and every check kept. First,
    # so that the deadline tests below start while the normal build runs.
    stage "ASan build" build build-asan -DREFIT_SANITIZE=ON -DREFIT_TESTS=ON \
      -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DREFIT_CUDA=OFF -DREFIT_FUZZ=OFF
    # Open MPI keeps some memory until exit by design: the unit and fault
    # tests (100 refits with injected failures among them) check that no
    # leak comes from refit's own code, the other MPI and agent tests run
    # without leak checking.
    leaks=(env ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions="$root/tests/lsan-mpi.supp")
    asan=(ctest --test-dir build-asan --output-on-failure)
    # The tests labelled deadline (a rank killed or stalled, waited out at a
    # deadline of a few seconds) run one at a time at normal priority, beside
    # everything else, which runs niced: they get the CPU whenever they want
    # it, as if alone, and the rest of the suite (the normal build first)
    # takes the time they spend waiting out their deadlines
    # (docs/testing.md).
    deadline_log=$root/build-asan/deadline-tests.log
    # Those among them labelled fault check for leaks, as the other fault
    # tests do; the rest (mpi) do not, as the other mpi tests do not.
    ( start=$SECONDS rc=0
      { "${leaks[@]}" "${asan[@]}" -L '^deadline$' -L '^fault$' -LE '^gpu$' || rc=$?
        ASAN_OPTIONS=detect_leaks=0 "${asan[@]}" -L '^deadline$' -LE '^(gpu|fault)$' || rc=$?
      } >"$deadline_log" 2>&1
      echo "bootstrap: ASan deadline tests: $((SECONDS - start)) s" >>"$deadline_log"
      exit $rc ) &
    deadline_pid=$!
    (
      # Everything else, niced (its children inherit it).
      renice -n 10 -p "$BASHPID" >/dev/null
      # A test build: with the fault seam the fault tests fail refits with.
      stage "normal build" build build -DREFIT_TESTS=ON
      stage "python package" install_python_package
      # One more test than cores: some wait more than they compute (two
      # jobs that meet, a Slurm cluster starting, deadlines in the Python
      # error tests), and the cores work meanwhile.
      normal=(ctest --test-dir build --output-on-failure -j "$((jobs + 1))")
      c_tests='^(unit|mpi|fault|agent)$'
      if [ "$both" = 1 ]; then
        stage "normal suite" "${normal[@]}"
      else
        # Every test but the C tests, and those of them labelled fast or
        # gpu: one ctest run, by test number (-I), whose last tests share
        # the cores with its first instead of waiting for a second run.
        numbers() { ctest --test-dir build -N "$@" | sed -n 's/^ *Test *#\([0-9]*\):.*/\1/p'; }
        selected=$({ numbers -LE "$c_tests"; numbers -L '^(fast|gpu)$' -L "$c_tests"; } |
                   sort -n | paste -sd, -)
        stage "normal suite" "${normal[@]}" -I "0,0,0,$selected"
      fi
      # With -j: the tests that must run alone say so (RUN_SERIAL).
      stage "ASan unit and fault" "${leaks[@]}" "${asan[@]}" -j "$jobs" \
        -L '^(unit|fault)$' -LE '^(gpu|deadline)$'
      ASAN_OPTIONS=detect_leaks=0 stage "ASan mpi and agent" "${asan[@]}" \
        -j "$jobs" -L '^(mpi|agent)$' -LE '^(unit|fault|gpu|deadline)$'
    ) &
    rest_pid=$! # in the background too: errexit holds in it (not so in `( ) || ...`)
    rest_rc=0 deadline_rc=0
    wait "$rest_pid" || rest_rc=$?
    wait "$deadline_pid" || deadline_rc=$?
    cat "$deadline_log"
    [ "$rest_rc" -eq 0 ] && [ "$deadline_rc" -eq 0 ]
    ;;
  *)
    echo "usage: launch/bootstrap.sh demo|test|build" >&2
    exit 2
    ;;
esac

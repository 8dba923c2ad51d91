#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine (as root, or with sudo):
#
#   launch/bootstrap.sh demo   install what is missing, build, run the demo refit
#   launch/bootstrap.sh test   install what is missing, build (normal and
#                              ASan/UBSan), run the whole test suite
#   launch/bootstrap.sh build  install what is missing and build only
#
# Builds go to build/ (and build-asan/ for the sanitizer run). REFIT_CUDA
# (AUTO, ON, OFF; default AUTO) is passed to CMake.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
what=${1:-}
jobs=$(nproc)

packages=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin
          libyaml-dev libjansson-dev libhdf5-dev libucx-dev libcmocka-dev libssl-dev
          python3 python3-numpy python3-mpi4py)  # what `import refit` needs
# Test-only packages: a one-node Slurm cluster for tests/launch (label slurm),
# what the Python tests import (label python), and clang for the libFuzzer
# harnesses (label fuzz, built only where clang is found). Installed by `test`
# only; nothing at build or run time needs them.
test_packages=(slurmctld slurmd slurm-client munge clang libclang-rt-14-dev gdb
               python3-numpy python3-h5py python3-yaml python3-pytest python3-mpi4py
               python3-torch python3-venv)

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

build() { # build DIR [cmake args...]
  local dir=$1
  shift
  cmake -S "$root" -B "$dir" -DREFIT_CUDA="${REFIT_CUDA:-AUTO}" "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
}

# `import refit` for Debian's python3: a .pth file putting python/ on its
# path; the package finds build/runtime/librefit.so beside it (REFIT_LIBRARY
# overrides).
install_python_path() {
  local py=/usr/bin/python3 site
  [ -x "$py" ] || return 0
  site=$("$py" -c 'import site; print(site.getsitepackages()[0])')
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo mkdir -p "$site"
  echo "$root/python" | $sudo tee "$site/refit.pth" >/dev/null
}

case "$what" in
  build)
    install_missing
    build build
    install_python_path
    ;;
  demo)
    install_missing
    build build
    install_python_path
    exec "$root/launch/refit-launch" --build-dir "$root/build" "$root/configs/demo.yaml"
    ;;
  test)
    install_missing
    install_missing "${test_packages[@]}"
    build build
    install_python_path
    (cd build && ctest --output-on-failure -j "$jobs")
    # The sanitizer build runs the same suite. Open MPI keeps some memory
    # until exit by design: the fault tests (100 refits with injected
    # failures among them) check that no leak comes from refit's own code,
    # the other MPI tests run without leak checking. It is built without
    # CUDA (the suite it runs is host memory only), so that a machine
    # without the CUDA toolkit builds too: both configurations compile here.
    build build-asan -DREFIT_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug -DREFIT_CUDA=OFF
    (cd build-asan &&
      ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j "$jobs" -L unit &&
      ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure -j "$jobs" -L mpi -LE fault &&
      ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure -L '^agent$' &&
      ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions="$root/tests/lsan-mpi.supp" \
        ctest --output-on-failure -L fault)
    ;;
  *)
    echo "usage: launch/bootstrap.sh demo|test|build" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# NCCL M2N beside refit on two GPUs of one host (docs/benchmarks.md, the
# issue "Two-GPU runs"): NVIDIA's NCCL M2N (nccl_m2n in NVIDIA/nccl-extensions)
# built from its public source, its own model benchmark on Qwen3-32B
# dp1-tp1 -> dp1-tp1, refit's refit of the same model on the same two GPUs
# (configs/qwen3-32b-disagg-bf16.yaml, BF16 over NCCL), and raw NCCL GPU0 ->
# GPU1, in one session.
#
#   launch/bench-m2n.sh BUILD_DIR SRC_DIR OUT_DIR [build]
#
# With `build` it only builds NCCL and nccl_m2n (any GPU machine, one GPU
# too) and says how long that took.
#
# SRC_DIR holds the two public sources, unpacked by the caller (they are
# never part of this repository; put them in an ignored folder such as
# .device/m2n and carry it):
#   SRC_DIR/nccl             NVIDIA/nccl at the commit nccl_m2n pins as its
#                            third_party/nccl submodule (v2.30.7 for
#                            nccl-extensions 44d2de0): nccl_m2n needs NCCL
#                            2.30.5 or newer, newer than the NCCL of the CUDA
#                            13.0 toolkit (2.28.9)
#   SRC_DIR/nccl-extensions  NVIDIA/nccl-extensions (nccl_m2n/ and makefiles/)
# e.g. git -C <nccl mirror> archive <commit> | tar -x -C SRC_DIR/nccl.
#
# NCCL is built for sm_90 only into SRC_DIR/nccl/build (once; minutes on 16
# cores), nccl_m2n's library and reshard_model_bench against it. M2N runs with
# that NCCL on its library path; refit with the one it was built with.
# Logs go to OUT_DIR; a summary is printed.
set -uo pipefail
build=$1 src=$2 out=$3 only=${4:-}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on shared machines
cuda=${CUDA_HOME:-/usr/local/cuda}
gencode="-gencode=arch=compute_90,code=sm_90"
have=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU ")
if [ "$have" -lt 2 ] && [ "$only" != build ]; then
  echo "bench-m2n: needs two GPUs of one host, $have visible" >&2
  exit 2
fi
for d in "$src/nccl/src" "$src/nccl-extensions/nccl_m2n" "$src/nccl-extensions/makefiles"; do
  [ -d "$d" ] || { echo "bench-m2n: $d is missing (see the header for SRC_DIR)" >&2; exit 2; }
done

t0=$(date +%s)
nccl=$src/nccl/build
if [ ! -f "$nccl/include/nccl_device.h" ]; then
  echo "== building NCCL ($(sed -n 's/^NCCL_\(MAJOR\|MINOR\|PATCH\) *:= *//p' \
    "$src/nccl/makefiles/version.mk" | paste -sd.)) for sm_90"
  make -C "$src/nccl" -j"$(nproc)" src.build CUDA_HOME="$cuda" NVCC_GENCODE="$gencode" \
    BUILDDIR="$nccl" >"$out/nccl-build.log" 2>&1 ||
    { echo "bench-m2n: NCCL build failed, see $out/nccl-build.log" >&2; tail -20 "$out/nccl-build.log"; exit 1; }
fi
# nccl_m2n's benchmarks take MPI from MPI_HOME/include and MPI_HOME/lib.
mpi_home=${MPI_HOME:-$(dirname "$(mpicc --showme:incdirs | awk '{print $1}')")}
m2n=$src/nccl-extensions/build
echo "== building nccl_m2n and reshard_model_bench"
make -C "$src/nccl-extensions/nccl_m2n" -j"$(nproc)" lib bench NCCL_HOME="$nccl" \
  CUDA_HOME="$cuda" MPI_HOME="$mpi_home" NVCC_GENCODE="$gencode" BUILDDIR="$m2n" \
  >"$out/m2n-build.log" 2>&1 ||
  { echo "bench-m2n: nccl_m2n build failed, see $out/m2n-build.log" >&2; tail -20 "$out/m2n-build.log"; exit 1; }

echo "== built NCCL and nccl_m2n in $(($(date +%s) - t0)) s"
ls "$m2n/lib" "$m2n/bin" 2>&1 | head -8
[ "$only" = build ] && exit 0
cfgs=$src/nccl-extensions/nccl_m2n/benchmarks/configs
m2n_run() { # name extra-args...
  local name=$1
  shift
  timeout 900 mpirun -np 2 --allow-run-as-root -x LD_LIBRARY_PATH="$m2n/lib:$nccl/lib:${LD_LIBRARY_PATH:-}" \
    -x NCCL_NVLS_ENABLE "$m2n/bin/reshard_model_bench" \
    --model-config "$cfgs/model_configs/qwen3-32b.model.json" \
    --system-config "$cfgs/system_configs/qwen3-32b-dp1-tp1-to-dp1-tp1.json" \
    --gpus-per-node 2 "$@" >"$out/$name.log" 2>&1
  echo "== $name: exit $?"
  grep -iE "total|latency|bandwidth|GB/s|error|fail" "$out/$name.log" | head -20
}
m2n_run m2n-validate --iterations 1 --warmup 1 --validate
m2n_run m2n-time --iterations 10 --warmup 2

refit_run() { # name config
  timeout 900 "$root/launch/refit-launch" --build-dir "$build" "$2" >"$out/$1.log" 2>&1
  echo "== $1: exit $?"
  grep -E "^plan:|^ +[0-9]+ +[0-9]+ |refit-run: (verified|FAILED|[0-9])|failed" "$out/$1.log" | head -12
}
sed 's/^verify: false.*/verify: true/; s/^  steps: 6/  steps: 2/' \
  "$root/configs/qwen3-32b-disagg-bf16.yaml" >"$out/refit-verify.yaml"
refit_run refit-verify "$out/refit-verify.yaml"
refit_run refit-time "$root/configs/qwen3-32b-disagg-bf16.yaml"

timeout 300 "$root/launch/refit-launch" --np 2 --build-dir "$build" \
  "$root/tests/gpu/gpu_link.yaml" -- "$build/tests/gpu/refit-bench-link" >"$out/link.log" 2>&1
echo "== link (raw NCCL and IPC GPU0 -> GPU1): exit $?"
grep -E "size|GiB|MiB" "$out/link.log" | tail -8

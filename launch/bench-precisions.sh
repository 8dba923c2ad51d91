#!/usr/bin/env bash
# Colocated refit of Qwen3-30B-A3B on one GPU in each precision
# (docs/benchmarks.md, issue 39): configs/qwen3-30b-a3b-disagg.yaml with both
# ranks on the one visible GPU, staged (zero_copy: off) and zero copy,
# restore: none, digests off, 6 refits (1 warm-up + 5 timed),
# and the copy ceiling of the same run (refit-bench-kernels). LAYERS (default
# 24 of the model's 48, so that the trainer's BF16 copy and the runtime
# tensors fit one 80 GB H100 together) sets num_layers.
#
#   launch/bench-precisions.sh BUILD_DIR OUT_DIR
set -uo pipefail
build=$1 out=$2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$out"
base=$root/configs/qwen3-30b-a3b-disagg.yaml
run() { # name precision verify steps [zero_copy [prequantize]]
  local cfg=$out/$1.yaml
  sed -e "s/^verify: false.*/verify: $3/" -e "s/^  steps: 6/  steps: $4/" \
    -e "s/^  precision: mxfp8/  precision: $2/" \
    -e "s/^  num_layers: 48 /  num_layers: ${LAYERS:-24} /" \
    -e "s/^  timeout_s: 300/  timeout_s: 120\n  restore: none\n  zero_copy: ${5:-off}\n  prequantize: ${6:-false}\n  digests: false/" \
    "$base" >"$cfg"
  timeout 300 "$root/launch/refit-launch" --build-dir "$build" "$cfg" >"$out/$1.log" 2>&1
  echo "== $1: exit $?"
  grep -E "^ +refit|^ +[0-9]+ +[0-9]+ |verified|FAILED|error|memory" "$out/$1.log" | head -12
}
timeout 240 "$build/kernels/refit-bench-kernels" >"$out/kernels.log" 2>&1
grep -E "^cudaMemcpy D2D \(GPU ceiling\)|fp8_block|nvfp4" "$out/kernels.log"
run fp8_block-verify fp8_block true 2
run fp8_block fp8_block false 6
run nvfp4-verify nvfp4 true 2
run nvfp4 nvfp4 false 6
run mxfp8 mxfp8 false 6
run bf16 bf16 false 6
run mxfp8-zero-copy mxfp8 false 6 on
# Block FP8 zero copy: with prequantize the plan marks whole-block tensors,
# quantized from the trainer's rows into place; without, every tensor is
# copied into the arena and quantized whole. NVFP4 zero copy assembles.
run fp8_block-zc-verify fp8_block true 2 on true
run fp8_block-zc fp8_block false 6 on true
run fp8_block-zc-arena fp8_block false 6 on false
run nvfp4-zc-verify nvfp4 true 2 on
run nvfp4-zc nvfp4 false 6 on

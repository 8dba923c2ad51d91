#!/usr/bin/env bash
# The GPU refit benchmark (docs/benchmarks.md): Qwen3-30B-A3B, whole model,
# BF16 on the trainer -> MXFP8 TRTLLM layout on the generator, on a machine
# with two GPUs.
#
#   launch/bench-gpu.sh BUILD_DIR OUT_DIR [verify|time|link ...]
#
#   verify  each scenario with verify on (2 refits, bit for bit)
#   time    each scenario with verify off (6 refits: 1 warm-up + 5 timed)
#   link    raw NCCL and IPC bandwidth GPU0 -> GPU1 in the same session
#   variants scenario (a) timed with one setting changed: digests off,
#           async mode (commit pause), NCCL instead of IPC, NCCL with
#           keep_staging: false, and the per-tensor expert-by-expert baseline
#   async   scenarios (a) and (b) timed in async mode (the commit pause)
#   pairs   scenarios (a) and (b) with refit.locality: gpu (each GPU a node:
#           the per-pair transport, IPC within a GPU and NCCL between GPUs,
#           as across hosts), verified and then timed
#   python  scenario (a) on whatever GPUs there are (one: both ranks share
#           it): refit-run, then launch/bench_python.py with torch tensors
#           (synthetic source, verified once), then source.kind caller with
#           the trainer's torch tensors under Hugging Face and Megatron-Core
#           names
#   delta   issue 20 on one GPU: the delta tests of the unit and gpu labels
#           (ctest, serially), then configs/bench-delta.yaml colocated
#           (transport ipc, zero_copy off, device memory) at 252 MiB and at
#           3.32 GiB per refit, delta on and off (and at 3.32 GiB on with
#           delta_baseline: host), with each process's GPU
#           memory sampled by nvidia-smi every 0.1 s: the sum of the ranks'
#           peaks, and the trainers' baselines as they report them; then
#           pinned-host copy bandwidth (launch/bench_pcie.py), the ceiling of
#           delta_baseline: host
#
# Logs go to OUT_DIR/<scenario>-<what>.log; a summary is printed.
set -uo pipefail
build=$1 out=$2
shift 2
what=("$@")
[ ${#what[@]} -eq 0 ] && what=(verify time link)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on shared machines
scenarios=(qwen3-30b-a3b-disagg qwen3-30b-a3b-disagg-prequant qwen3-30b-a3b-colocated
  qwen3-30b-a3b-colocated-prequant)

run_cfg() { # name config
  local name=$1 cfg=$2 t0 t1
  t0=$(date +%s)
  timeout 500 "$root/launch/refit-launch" --build-dir "$build" "$cfg" >"$out/$name.log" 2>&1
  local rc=$?
  t1=$(date +%s)
  echo "== $name: exit $rc, $((t1 - t0)) s"
  grep -E "^refit-run|^plan:|^ +[0-9]+ +[0-9]+ |refit-run: (verified|FAILED|[0-9])|WARN|failed|memory" "$out/$name.log" | head -20
}

for w in "${what[@]}"; do
  case "$w" in
    verify | time)
      for sc in "${scenarios[@]}"; do
        cfg=$out/$sc-$w.yaml
        if [ "$w" = verify ]; then
          sed 's/^verify: false.*/verify: true/; s/^  steps: 6/  steps: 2/' \
            "$root/configs/$sc.yaml" >"$cfg"
        else
          cp "$root/configs/$sc.yaml" "$cfg"
        fi
        run_cfg "$sc-$w" "$cfg"
      done
      ;;
    variants)
      base=$root/configs/qwen3-30b-a3b-disagg.yaml
      add() { # name sed-expression
        sed "$2" "$base" >"$out/disagg-$1.yaml"
        run_cfg "disagg-$1" "$out/disagg-$1.yaml"
      }
      add digests-off 's/^  timeout_s: 300/  timeout_s: 300\n  digests: false/'
      add async 's/^  mode: sync/  mode: async/'
      add nccl 's/^  transport: auto/  transport: nccl/'
      add nccl-release 's/^  transport: auto/  transport: nccl\n  keep_staging: false/'
      add baseline 's/^  bucket_bytes: 512MiB/  bucket_bytes: 1GiB\n  baseline: true/'
      ;;
    async)
      for sc in qwen3-30b-a3b-disagg qwen3-30b-a3b-colocated; do
        sed 's/^  mode: sync/  mode: async/' "$root/configs/$sc.yaml" >"$out/$sc-async.yaml"
        run_cfg "$sc-async" "$out/$sc-async.yaml"
      done
      ;;
    pairs)
      for sc in qwen3-30b-a3b-disagg qwen3-30b-a3b-colocated; do
        sed 's/^  transport: auto.*/  transport: auto\n  locality: gpu/' \
          "$root/configs/$sc.yaml" >"$out/$sc-pairs-time.yaml"
        sed 's/^verify: false.*/verify: true/; s/^  steps: 6/  steps: 2/' \
          "$out/$sc-pairs-time.yaml" >"$out/$sc-pairs-verify.yaml"
        run_cfg "$sc-pairs-verify" "$out/$sc-pairs-verify.yaml"
        run_cfg "$sc-pairs-time" "$out/$sc-pairs-time.yaml"
      done
      ;;
    python)
      sc=qwen3-30b-a3b-disagg
      py=${PYTHON:-python3}
      cp "$root/configs/$sc.yaml" "$out/$sc-python.yaml"
      sed 's/^  kind: synthetic/  kind: caller/; /^  seed: /d; s/^trainer:/trainer:\n  layout: hf/' \
        "$root/configs/$sc.yaml" >"$out/$sc-caller-hf.yaml"
      sed 's/^  kind: synthetic/  kind: caller/; /^  seed: /d; s/^trainer:/trainer:\n  layout: megatron/' \
        "$root/configs/$sc.yaml" >"$out/$sc-caller-megatron.yaml"
      run_cfg "$sc-python-refit-run" "$out/$sc-python.yaml"
      for v in python:"" caller-hf:--caller caller-megatron:--caller; do
        name=${v%%:*} flag=${v#*:} cfg=$out/$sc-$name.yaml
        REFIT_LIBRARY=$build/runtime/librefit.so \
          timeout 500 "$root/launch/refit-launch" --build-dir "$build" "$cfg" -- \
          "$py" "$root/launch/bench_python.py" "$cfg" $flag >"$out/$sc-$name-bench.log" 2>&1
        echo "== $sc-$name (bench_python): exit $?"
        grep -E "^bench_python|Error|error" "$out/$sc-$name-bench.log" | head -5
      done
      ;;
    delta)
      (cd "$build" && timeout 1800 ctest -R "delta|test_kernels_mxfp8|test_kernels_cuda" \
        -L "gpu|unit" --output-on-failure) >"$out/delta-ctest.log" 2>&1
      echo "== delta ctest: exit $?"
      grep -E "tests passed|tests failed|\*\*\*" "$out/delta-ctest.log" | head -20
      for size in 252MiB 3.32GiB; do
        for d in on off host; do
          [ $size = 252MiB ] && [ $d = host ] && continue
          name=delta-$size-$d cfg=$out/delta-$size-$d.yaml
          sed -e '/device_map: none/d' -e "s/^  delta: on/  delta: ${d/host/on}/" \
            -e 's/^  transport: mpi/  transport: ipc\n  zero_copy: off/' \
            -e 's/^  steps: 6/  steps: 8/' "$root/configs/bench-delta.yaml" >"$cfg"
          [ $d = host ] && sed -i 's/^  delta: on/  delta: on\n  delta_baseline: host/' "$cfg"
          [ $size = 3.32GiB ] && sed -i -e 's/^  hidden_size: 1024/  hidden_size: 2048/' \
            -e 's/^  num_layers: 8/  num_layers: 16/' -e 's/^  num_experts: 32/  num_experts: 64/' \
            -e 's/^  moe_intermediate_size: 256/  moe_intermediate_size: 512/' \
            -e 's/^  bucket_bytes: 16MiB/  bucket_bytes: 256MiB/' "$cfg"
          # The processes of an earlier run gone from the GPU (up to 10 s).
          for _ in $(seq 50); do
            [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ] && break
            sleep 0.2
          done
          nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits \
            -lms 100 >"$out/$name-gpu-memory.csv" 2>/dev/null &
          sampler=$!
          REFIT_DEBUG=INFO run_cfg "$name" "$cfg"
          kill $sampler 2>/dev/null
          wait $sampler 2>/dev/null
          grep -h "baseline of the last committed version" "$out/$name.log" | head -2
          awk -F', *' '$2+0 > peak[$1] {peak[$1] = $2+0}
            END {for (p in peak) {n++; sum += peak[p]; each = each " " p ":" peak[p]}
                 printf "GPU memory: %d processes, peaks summed %d MiB (pid:peak%s)\n", n, sum, each}' \
            "$out/$name-gpu-memory.csv"
        done
      done
      # The ceiling of delta_baseline: host: pinned copies over PCIe, as
      # large as one trainer's baseline, in the same run.
      "${PYTHON:-python3}" "$root/launch/bench_pcie.py" 1666 5 2>&1 | tee "$out/delta-pcie.log"
      ;;
    link)
      timeout 300 "$root/launch/refit-launch" --np 2 --build-dir "$build" \
        "$root/tests/gpu/gpu_link.yaml" -- "$build/tests/gpu/refit-bench-link" \
        >"$out/link.log" 2>&1
      echo "== link: exit $?"
      grep -E "size|GiB|MiB" "$out/link.log" | tail -8
      ;;
    *) echo "bench-gpu: unknown step '$w'" >&2; exit 2 ;;
  esac
done

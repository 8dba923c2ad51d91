#!/usr/bin/env bash
# I/O tests through the project's launcher (each mode is one ctest):
#   run_io.sh BUILD ckpt bf16|f32|f16  checkpoint written by refit-ckpt refits
#                                      and verifies against the file
#   run_io.sh BUILD dump               dump after the last refit matches the
#                                      reference bit for bit (refit-dump-check)
#   run_io.sh BUILD dump-ckpt          f16 checkpoint of synthetic version 7,
#                                      refit, dump: the dump must equal the
#                                      synthetic values of version 7
#   run_io.sh BUILD bad                broken checkpoints (a FIFO among them)
#                                      are rejected before any transfer, with
#                                      the asserted message, within a minute
#   run_io.sh BUILD ucx                refit.transport ucx verifies bit for bit
#   run_io.sh BUILD st DTYPE SHARDS    a safetensors checkpoint by refit-ckpt
#                                      (one file, or SHARDS files and an index)
#                                      refits; its dump equals the dump of the
#                                      HDF5 checkpoint of the same weights
#   run_io.sh BUILD bad-st             broken safetensors files and indexes
#                                      (FIFOs among them) are rejected before
#                                      any transfer, within a minute, every
#                                      problem listed with file and tensor
#   run_io.sh BUILD hf-presets         configs/*-hf.yaml (shapes from
#                                      config.json) plan as their typed twins
set -uo pipefail
build=$1 mode=$2 arg=${3:-} arg2=${4:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ckpt_bin=$build/runtime/refit-ckpt
check_bin=$build/tests/io/refit-dump-check
bad_bin=$build/tests/io/make_bad_ckpt

fail() { echo "run_io: FAIL: $*"; exit 1; }

# config NAME GENERATOR_YAML [EXTRA_YAML]: the base model plus the sections.
config() {
  local out=$tmp/$1.yaml
  { cat "$here/io_base.yaml"; printf '%s\n' "$2" "${3:-}"; } >"$out"
  echo "$out"
}
gen1='generator:
  tp: 2
  ep: 2
refit:
  transport: auto
  bucket_bytes: 128KiB
  timeout_s: 60
  steps: 3'

# refit CONFIG EXPECTED: through run_refit.sh (exit 0 and the line).
refit() { "$root/tests/mpi/run_refit.sh" "$build" "$1" "$2" || fail "refit of $1"; }

case "$mode" in
  ckpt)
    cfg=$(config ckpt "$gen1" "source:
  kind: hdf5
  path: $tmp/ckpt.h5")
    "$ckpt_bin" "$cfg" "$tmp/ckpt.h5" --dtype "$arg" || fail "refit-ckpt --dtype $arg"
    refit "$cfg" "refit-run: verified: 3 refits"
    ;;
  dump)
    # 2 engines of tp2: dump groups /rank0../rank3 with tp ranks 0,1,0,1.
    cfg=$(config dump "${gen1/ep: 2/ep: 2
  engines: 2}" "dump: $tmp/dump.h5")
    refit "$cfg" "refit-run: verified: 3 refits"
    [ -s "$tmp/dump.h5" ] || fail "no dump written"
    "$check_bin" "$tmp/dump.h5" --version 3 || fail "dump does not match"
    # The checker must notice a dump of another version.
    if "$check_bin" "$tmp/dump.h5" --synthetic-version 2 >"$tmp/neg" 2>&1; then
      cat "$tmp/neg"; fail "refit-dump-check accepted version 2 values for version 3"
    fi
    grep -q "expected 0x" "$tmp/neg" || { cat "$tmp/neg"; fail "no mismatch reported"; }
    ;;
  dump-ckpt)
    cfg=$(config dumpckpt "$gen1" "source:
  kind: hdf5
  path: $tmp/ckpt.h5
dump: $tmp/dump.h5")
    "$ckpt_bin" "$cfg" "$tmp/ckpt.h5" --dtype f16 --version 7 || fail "refit-ckpt"
    refit "$cfg" "refit-run: verified: 3 refits"
    "$check_bin" "$tmp/dump.h5" --version 3 --synthetic-version 7 ||
      fail "dump of a version-7 checkpoint differs from synthetic version 7"
    ;;
  bad)
    cfg=$(config bad "$gen1" "source:
  kind: hdf5
  path: $tmp/bad.h5")
    "$ckpt_bin" "$cfg" "$tmp/good.h5" || fail "refit-ckpt"
    t=model.layers.1.self_attn.o_proj.weight
    n=model.layers.0.input_layernorm.weight
    # expect KIND MESSAGE: refit-run must exit 2 before any refit, saying MESSAGE.
    expect() {
      local out=$tmp/out.$1
      # Refused within a minute: a path that blocks its reader must not hang.
      timeout -k 5 60 "$root/launch/refit-launch" --build-dir "$build" "$cfg" >"$out" 2>&1
      local rc=$?
      cat "$out"
      [ $rc -ne 124 ] && [ $rc -ne 137 ] || fail "$1: still running after 60 s (hung)"
      [ $rc -eq 2 ] || fail "$1: exit status $rc, expected 2"
      grep -qF -- "$2" "$out" || fail "$1: output lacks '$2'"
      grep -qF "$tmp/bad.h5" "$out" || fail "$1: message does not name the file"
      if grep -qE '^ +1 +1 ' "$out"; then fail "$1: a refit ran"; fi
      grep -qi "segmentation\|sanitizer\|HDF5-DIAG" "$out" && fail "$1: crashed or HDF5 printed its stack"
      echo "run_io: $1 rejected: ok"
    }
    "$bad_bin" "$tmp/good.h5" missing "$t" "$tmp/bad.h5" || fail make_bad_ckpt
    expect missing "dataset '$t' is missing (expected [128, 128]"
    "$bad_bin" "$tmp/good.h5" shape "$t" "$tmp/bad.h5" || fail make_bad_ckpt
    expect shape "dataset '$t' has shape [256, 128], expected [128, 128]"
    "$bad_bin" "$tmp/good.h5" shape "$n" "$tmp/bad.h5" || fail make_bad_ckpt
    expect shape-1d "dataset '$n' has shape [256], expected [128]"
    "$bad_bin" "$tmp/good.h5" dtype "$t" "$tmp/bad.h5" || fail make_bad_ckpt
    expect dtype "dataset '$t': unsupported element type (32-bit signed integer)"
    "$bad_bin" "$tmp/good.h5" attr "$t" "$tmp/bad.h5" || fail make_bad_ckpt
    expect attr "dataset '$t': 16-bit unsigned integers with dtype attribute \"float16\"; expected dtype = \"bfloat16\""
    "$bad_bin" "$tmp/good.h5" attr-array "$t" "$tmp/bad.h5" || fail make_bad_ckpt
    expect attr-array "attribute dtype holds an array of 2 strings; expected one scalar string"
    size=$(stat -c %s "$tmp/good.h5")
    head -c $((size / 2)) "$tmp/good.h5" >"$tmp/bad.h5"
    expect truncated "cannot open it as HDF5; the file is damaged or truncated"
    printf 'model.layers.0 = not a checkpoint\n' >"$tmp/bad.h5"
    expect not-hdf5 "not an HDF5 file"
    rm -f "$tmp/bad.h5"
    expect absent "No such file or directory"
    # A FIFO blocks whoever opens it for reading until a writer comes.
    mkfifo "$tmp/bad.h5" || fail mkfifo
    expect fifo "$tmp/bad.h5: the checkpoint is a FIFO, not a regular file"
    # The same for the configuration itself, through the launcher.
    mkfifo "$tmp/fifo.yaml" || fail mkfifo
    timeout -k 5 60 "$root/launch/refit-launch" --build-dir "$build" "$tmp/fifo.yaml" >"$tmp/out.cfg" 2>&1
    rc=$?
    cat "$tmp/out.cfg"
    [ $rc -ne 124 ] && [ $rc -ne 137 ] || fail "config fifo: still running after 60 s (hung)"
    [ $rc -eq 2 ] || fail "config fifo: exit status $rc, expected 2"
    grep -qF "$tmp/fifo.yaml: the configuration is a FIFO, not a regular file" "$tmp/out.cfg" ||
      fail "config fifo: the FIFO is not named"
    echo "run_io: config fifo rejected: ok"
    ;;
  ucx)
    # Host memory on GPU machines too (the GPU tests cover UCX on devices).
    cfg=$(config ucx "${gen1/transport: auto/transport: ucx$'\n'  device_map: none}")
    out=$tmp/ucx.out
    "$root/tests/mpi/run_refit.sh" "$build" "$cfg" "refit-run: verified: 3 refits" >"$out" 2>&1
    rc=$?
    cat "$out"
    [ $rc -eq 0 ] || fail "ucx refit"
    grep -q "transport ucx" "$out" || fail "the header does not say transport ucx"
    ;;
  st)
    # The same weights twice: HDF5 and safetensors; the dumps (generator
    # bytes as stored) must be equal, and each refit verifies.
    h5=$(config sth5 "$gen1" "source:
  kind: hdf5
  path: $tmp/ckpt.h5
dump: $tmp/dump-h5.h5")
    st=$(config stst "$gen1" "source:
  kind: safetensors
  path: $tmp/ckpt-st
dump: $tmp/dump-st.h5")
    "$ckpt_bin" "$h5" "$tmp/ckpt.h5" --dtype "$arg" || fail "refit-ckpt hdf5"
    "$ckpt_bin" "$st" "$tmp/ckpt-st" --dtype "$arg" --format safetensors --shards "$arg2" ||
      fail "refit-ckpt safetensors"
    if [ "$arg2" -gt 1 ]; then
      [ -f "$tmp/ckpt-st/model.safetensors.index.json" ] || fail "no index"
    else
      mv "$tmp/ckpt-st" "$tmp/one.safetensors" && sed -i "s#$tmp/ckpt-st#$tmp/one.safetensors#" "$st"
    fi
    refit "$h5" "refit-run: verified: 3 refits"
    refit "$st" "refit-run: verified: 3 refits"
    # Both checkpoints hold synthetic version 1 (exact in each element
    # type): each dump must be those values, so the two are equal.
    for d in h5 st; do
      "$check_bin" "$tmp/dump-$d.h5" --version 3 --synthetic-version 1 ||
        fail "the $d dump differs from the weights of its checkpoint"
    done
    ;;
  bad-st)
    cfg=$(config badst "$gen1" "source:
  kind: safetensors
  path: $tmp/bad")
    "$ckpt_bin" "$cfg" "$tmp/good.safetensors" --format safetensors || fail "refit-ckpt"
    "$ckpt_bin" "$cfg" "$tmp/good" --format safetensors --shards 2 || fail "refit-ckpt"
    # expect CASE MESSAGE...: refit-run exits 2 before any refit, saying each.
    expect() {
      local what=$1 out=$tmp/out.$1
      shift
      timeout -k 5 60 "$root/launch/refit-launch" --build-dir "$build" "$cfg" >"$out" 2>&1
      local rc=$?
      cat "$out"
      [ $rc -ne 124 ] && [ $rc -ne 137 ] || fail "$what: still running after 60 s (hung)"
      [ $rc -eq 2 ] || fail "$what: exit status $rc, expected 2"
      for m in "$@"; do grep -qF -- "$m" "$out" || fail "$what: output lacks '$m'"; done
      if grep -qE '^ +1 +1 ' "$out"; then fail "$what: a refit ran"; fi
      grep -qi "segmentation\|sanitizer\|runtime error" "$out" && fail "$what: crashed"
      echo "run_io: $what rejected: ok"
    }
    # make_bad_st.py needs only the standard library: any python3 does,
    # the tests' own (PYTHON) first, which starts without a pyenv shim.
    . "$root/tests/find_python.sh"
    refit_find_python run_io json || exit 1
    for c in $("$python" "$here/make_bad_st.py" --list); do
      rm -rf "$tmp/bad"
      "$python" "$here/make_bad_st.py" "$c" "$tmp/good.safetensors" "$tmp/good" "$tmp/bad" >"$tmp/want" ||
        fail "make_bad_st.py $c"
      mapfile -t want <"$tmp/want"
      expect "st-$c" "$tmp/bad" "${want[@]}"
    done
    ;;
  hf-presets)
    # Every line but the command and the planning time, hash included.
    for y in "$root"/configs/*-hf.yaml; do
      typed=${y%-hf.yaml}.yaml
      "$build/runtime/refit-plan" "$y" >"$tmp/hf" 2>&1 || { cat "$tmp/hf"; fail "refit-plan $y"; }
      "$build/runtime/refit-plan" "$typed" >"$tmp/typed" 2>&1 || fail "refit-plan $typed"
      grep -q "plan hash" "$tmp/hf" || fail "$y: no plan hash"
      diff <(grep -v "^refit-plan\|planned in" "$tmp/typed") <(grep -v "^refit-plan\|planned in" "$tmp/hf") ||
        fail "$y plans differently from $typed"
      echo "run_io: $(basename "$y") plans as $(basename "$typed"): ok"
    done
    ;;
  *) echo "usage: run_io.sh BUILD ckpt bf16|f32|f16 | dump | dump-ckpt | bad | ucx | st DTYPE SHARDS | bad-st | hf-presets" >&2; exit 2 ;;
esac
echo "run_io: $mode ${arg} ok"

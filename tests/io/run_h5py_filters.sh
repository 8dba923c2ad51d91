#!/usr/bin/env bash
# HDF5 checkpoints written by h5py with compression: gzip-compressed
# chunked datasets refit and verify; a dataset compressed with h5py's lzf
# filter (which the C library cannot decode) is refused when the source
# opens, naming the file, the dataset and the filter, before any refit.
#   run_h5py_filters.sh BUILD_DIR CONFIG
set -uo pipefail
build=$(cd "$1" && pwd) config=$2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
. "$root/tests/find_python.sh"
refit_find_python run_h5py_filters numpy h5py yaml || exit 1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "run_h5py_filters: FAIL: $*"; exit 1; }
"$build/runtime/refit-ckpt" "$config" "$work/plain.h5" >/dev/null || fail "refit-ckpt"
"$python" - "$config" "$work" <<'PY' || fail "writing the h5py checkpoints"
import sys, h5py, yaml
config, work = sys.argv[1:]
with h5py.File(work + "/plain.h5", "r") as src, \
     h5py.File(work + "/gzip.h5", "w") as gz, h5py.File(work + "/lzf.h5", "w") as lzf:
    names = []
    src.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    for i, n in enumerate(sorted(names)):
        d = src[n]
        for dst, comp in ((gz, "gzip"), (lzf, "lzf" if i == 3 else None)):
            out = dst.create_dataset(n, data=d[()], compression=comp,
                                     chunks=True if comp else None)
            for k, v in d.attrs.items():
                out.attrs[k] = v
for name in ("gzip", "lzf"):
    cfg = yaml.safe_load(open(config))
    cfg["source"] = {"kind": "hdf5", "path": "%s/%s.h5" % (work, name)}
    cfg["verify"] = True
    yaml.safe_dump(cfg, open("%s/%s.yaml" % (work, name), "w"))
PY
out=$work/out.log
"$root/launch/refit-launch" --build-dir "$build" "$work/gzip.yaml" >"$out" 2>&1
rc=$?
cat "$out"
[ $rc -eq 0 ] && grep -q "refit-run: verified:" "$out" || fail "gzip checkpoint: exit $rc, not verified"
"$root/launch/refit-launch" --build-dir "$build" "$work/lzf.yaml" >"$out" 2>&1
rc=$?
cat "$out"
[ $rc -eq 2 ] || fail "lzf checkpoint: exit status $rc, expected 2 (refused at open)"
grep -q "compressed with filter 32000" "$out" || fail "lzf checkpoint: the refusal does not name the filter"
grep -qF "$work/lzf.h5" "$out" || fail "lzf checkpoint: the refusal does not name the file"
if grep -qE '^ +1 +1 ' "$out"; then fail "lzf checkpoint: a refit ran"; fi
echo "run_h5py_filters: ok"

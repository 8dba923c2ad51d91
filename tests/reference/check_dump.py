#!/usr/bin/env python3
"""check_dump.py CONFIG.yaml CHECKPOINT.h5 DUMP.h5 [--verbose]

Check refit's generator dump against the independent vLLM reference
(vllm_rules.py): every runtime store of every generator rank must be present,
no other store may be, and each must have the expected shape, element type
and bytes. Prints, per tensor with a difference, the mismatch count and the
first mismatch (tensor, rank, index, expected, actual); exits 1 on any
difference, 0 when the dump matches byte for byte.

Schemas (runtime/src/session/dump.h): the checkpoint holds one dataset per Hugging
Face tensor at full shape, uint16 with attribute dtype = "bfloat16", or
float32 / float16; the dump holds /rank<g>/<store name> with attributes
dtype, layout and version, and /rank<g> carries engine and tp_rank.
"""

import argparse
import os
import sys

import h5py
import numpy as np
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_rules  # noqa: E402  (found next to this file)


def _attr_str(obj, name):
    value = obj.attrs.get(name)
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def bf16_from_f32(values):
    """float32 -> bfloat16 bits, round to nearest even, NaN kept a quiet NaN:
    the conversion refit documents for float32 checkpoints (runtime/src/session/dump.h,
    refit_bf16_from_f32)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (bits >> 16) | 0x40, rounded).astype(np.uint16)


def read_checkpoint(path, job):
    """Every Hugging Face tensor of the model as bfloat16 bits, converted from
    float32 / float16 where the checkpoint holds those (float16 widens to
    float32 exactly first)."""
    weights = {}
    with h5py.File(path, "r") as f:
        for name, shape in vllm_rules.hf_tensor_shapes(job).items():
            if name not in f:
                raise SystemExit(f"check_dump: {path}: no dataset '{name}'")
            dset = f[name]
            if tuple(dset.shape) != shape:
                raise SystemExit(f"check_dump: {path}: '{name}' has shape {dset.shape}, "
                                 f"expected {shape}")
            data = dset[()]
            declared = _attr_str(dset, "dtype")
            if vllm_rules.is_float32(name):
                # float32 as it is; bfloat16 and float16 widen exactly.
                if data.dtype == np.uint16 and declared == "bfloat16":
                    data = (data.astype(np.uint32) << 16).view(np.float32)
                weights[name] = np.ascontiguousarray(data, dtype=np.float32)
            elif data.dtype == np.uint16 and declared == "bfloat16":
                weights[name] = data
            elif data.dtype in (np.float32, np.float16):
                weights[name] = bf16_from_f32(data.astype(np.float32))
            else:
                raise SystemExit(f"check_dump: {path}: '{name}' is {data.dtype} with dtype "
                                 f"attribute {declared!r}: expected uint16 'bfloat16', "
                                 f"float32 or float16")
    return weights


class Report:
    """Counts differences and prints each one with what a person needs to act."""

    def __init__(self, verbose):
        self.verbose = verbose
        self.bad_tensors = 0
        self.checked = 0
        self.bytes = 0

    def problem(self, rank, name, what):
        self.bad_tensors += 1
        print(f"MISMATCH rank {rank} {name}: {what}")

    def compare(self, rank, name, expected, dset):
        self.checked += 1
        want_dtype = vllm_rules.dtype_name(name, expected)
        got_dtype = _attr_str(dset, "dtype")
        if got_dtype != want_dtype or dset.dtype != expected.dtype:
            self.problem(rank, name, f"element type {dset.dtype} '{got_dtype}', "
                                     f"expected {expected.dtype} '{want_dtype}'")
            return
        if tuple(dset.shape) != expected.shape:
            self.problem(rank, name, f"shape {tuple(dset.shape)}, expected {expected.shape}")
            return
        actual = dset[()]
        self.bytes += actual.nbytes
        if expected.dtype == np.float32:  # bits, so that a NaN equals itself
            actual, expected = actual.view(np.uint32), expected.view(np.uint32)
        diff = actual != expected
        count = int(np.count_nonzero(diff))
        if count:
            first = tuple(int(k) for k in np.argwhere(diff)[0])
            self.problem(rank, name, f"{count} of {expected.size} elements differ; first at "
                                     f"index {first}: expected 0x{int(expected[first]):x}, "
                                     f"actual 0x{int(actual[first]):x}")
        elif self.verbose:
            print(f"ok       rank {rank} {name}: {expected.shape} {want_dtype}")


def check_mla_derived(report, job, weights, rank, tp_rank, group):
    """MLA's W_UK_T and W_UV, which vLLM derives from kv_b_proj after loading
    and which no store of the dump holds: with a BF16 kv_b_proj they are
    views of its storage (vllm_rules.mla_derived), so the refitted bytes of
    kv_b_proj must make them equal, element for element, to what the
    checkpoint's kv_b_proj gives by their definition."""
    for layer in range(job.layers):
        name = f"model.layers.{layer}.self_attn.kv_b_proj.weight"
        if name not in group:
            continue  # reported above
        quantized = _attr_str(group[name], "dtype") != "bfloat16"
        if quantized:
            # Block FP8: the views are of the BF16 dequantized copy refit
            # rewrites, expected as scaled_dequantize of the checkpoint's
            # kv_b_proj quantized whole and sharded (vllm_rules).
            name += "_dequant"
            if name not in group:
                continue  # reported above
        kv_b = group[name][()]
        w_uk_t, w_uv = vllm_rules.mla_derived(job, kv_b)
        report.checked += 2
        if not (np.shares_memory(w_uk_t, kv_b) and np.shares_memory(w_uv, kv_b)):
            report.problem(rank, name, "W_UK_T / W_UV are not views of kv_b_proj")
        source = weights
        if quantized:
            source = dict(weights)
            source[f"model.layers.{layer}.self_attn.kv_b_proj.weight"] = \
                vllm_rules.kv_b_proj_dequantized(job, weights, layer)
        want_uk, want_uv = vllm_rules.mla_derived_expected(job, source, layer, tp_rank)
        for what, got, want in (("W_UK_T", w_uk_t, want_uk), ("W_UV", w_uv, want_uv)):
            if got.shape != want.shape or np.count_nonzero(got != want):
                report.problem(rank, f"model.layers.{layer}.self_attn.{what}",
                               f"shape {got.shape} vs {want.shape} or "
                               f"{int(np.count_nonzero(got != want)) if got.shape == want.shape else '-'}"
                               f" elements differ from the checkpoint's kv_b_proj")
            elif report.verbose:
                print(f"ok       rank {rank} model.layers.{layer}.self_attn.{what}: {got.shape}")


def check(config_path, checkpoint_path, dump_path, verbose=False):
    with open(config_path) as f:
        job = vllm_rules.Job(yaml.safe_load(f))
    weights = read_checkpoint(checkpoint_path, job)
    report = Report(verbose)
    expected_by_tp = {}
    with h5py.File(dump_path, "r") as dump:
        if _attr_str(dump, "format") != "refit-dump-1":
            raise SystemExit(f"check_dump: {dump_path}: format {_attr_str(dump, 'format')!r}, "
                             f"expected 'refit-dump-1'")
        if int(dump.attrs["generator_tp"]) != job.tp:
            raise SystemExit(f"check_dump: {dump_path}: generator_tp "
                             f"{int(dump.attrs['generator_tp'])}, config says {job.tp}")
        ranks = int(dump.attrs["generator_ranks"])
        for g in range(ranks):
            group = dump.get(f"rank{g}")
            if group is None:
                report.problem(g, f"/rank{g}", "group missing")
                continue
            t = int(group.attrs["tp_rank"])
            if t not in expected_by_tp:
                expected_by_tp[t] = vllm_rules.runtime_tensors(job, weights, t)
            expected = expected_by_tp[t]
            for name in sorted(set(group) - set(expected)):
                report.problem(g, name, "store in the dump that vLLM does not hold")
            for name, want in expected.items():
                if name not in group:
                    report.problem(g, name, f"missing (expected {want.shape} "
                                            f"{vllm_rules.dtype_name(name, want)})")
                else:
                    report.compare(g, name, want, group[name])
            if job.mla:
                check_mla_derived(report, job, weights, g, t, group)
    verdict = "FAIL" if report.bad_tensors else "ok"
    print(f"check_dump: {verdict}: {ranks} generator ranks, {report.checked} stores compared "
          f"({report.bytes} bytes), {report.bad_tensors} with differences")
    return 1 if report.bad_tensors else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("checkpoint")
    parser.add_argument("dump")
    parser.add_argument("--verbose", action="store_true", help="also list matching stores")
    args = parser.parse_args()
    sys.exit(check(args.config, args.checkpoint, args.dump, args.verbose))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""write_safetensors.py CHECKPOINT.h5 OUT [--shards N]

Write the tensors of an HDF5 checkpoint (refit's schema: uint16 with dtype =
"bfloat16", or float32 / float16) as a Hugging Face safetensors checkpoint,
by the format's own rules and nothing of refit's: an 8-byte little-endian
header length, the JSON header padded with spaces to a multiple of 8 bytes,
"__metadata__" of strings, tensors laid out back to back ordered by
alignment (element size, largest first) then name; with --shards N > 1, OUT
is a directory of N files and model.safetensors.index.json. A bfloat16
tensor's bytes are its bit patterns, the uint16 the checkpoint holds, in
little-endian order, as PyTorch holds torch.bfloat16 and its writer stores
it (numpy has no bfloat16; the bytes are those of going through torch,
which this needs no import of torch for). Debian ships no `safetensors`
Python package; this follows its specification (huggingface/safetensors,
README "Format").
"""
import argparse
import json
import os
import struct

import h5py
import numpy as np

# The format's dtype names of the element types refit's checkpoints hold.
DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


def load(path):
    """name -> (safetensors dtype, contiguous numpy array of the bytes)."""
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if not isinstance(obj, h5py.Dataset):
                return
            data = np.ascontiguousarray(obj[()])
            declared = obj.attrs.get("dtype")
            declared = declared.decode() if isinstance(declared, bytes) else declared
            if data.dtype == np.uint16 and declared == "bfloat16":
                out[name] = (DTYPES["bfloat16"], data)
            elif data.dtype.name in DTYPES:
                out[name] = (DTYPES[data.dtype.name], data)
            else:
                raise SystemExit(f"write_safetensors: {path}: '{name}' is {data.dtype} with "
                                 f"dtype attribute {declared!r}: no safetensors type for it")
        f.visititems(visit)
    return out


def write_file(path, tensors):
    order = sorted(tensors, key=lambda k: (-tensors[k][1].itemsize, k))
    header = {"__metadata__": {"format": "pt", "writer": "tests/reference"}}
    at = 0
    blobs = []
    for name in order:
        dtype, a = tensors[name]
        raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [at, at + len(raw)]}
        at += len(raw)
        blobs.append(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def write(checkpoint, out, shards=1):
    """CHECKPOINT.h5 as OUT: one file, or with shards > 1 a directory of
    `shards` files and the index."""
    tensors = load(checkpoint)
    if shards <= 1:
        write_file(out, tensors)
        return
    os.makedirs(out, exist_ok=True)
    names = sorted(tensors)
    weight_map, total = {}, 0
    for s in range(shards):
        part = names[s::shards]  # round robin: every file holds all kinds
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        write_file(os.path.join(out, fname), {k: tensors[k] for k in part})
        for k in part:
            weight_map[k] = fname
            total += tensors[k][1].nbytes
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("out")
    ap.add_argument("--shards", type=int, default=1)
    a = ap.parse_args()
    write(a.checkpoint, a.out, a.shards)


if __name__ == "__main__":
    main()

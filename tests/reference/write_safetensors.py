#!/usr/bin/env python3
"""write_safetensors.py CHECKPOINT.h5 OUT [--shards N]

Write the tensors of an HDF5 checkpoint (refit's schema: uint16 with dtype =
"bfloat16", or float32 / float16) as a Hugging Face safetensors checkpoint,
by the format's own rules and nothing of refit's: an 8-byte little-endian
header length, the JSON header padded with spaces to a multiple of 8 bytes,
"__metadata__" of strings, tensors laid out back to back ordered by
alignment (element size, largest first) then name; with --shards N > 1, OUT
is a directory of N files and model.safetensors.index.json. bfloat16 goes
through torch.bfloat16, as PyTorch's writer would hold it. Debian ships no
`safetensors` Python package; this follows its specification
(huggingface/safetensors, README "Format").
"""
import argparse
import json
import os
import struct

import h5py
import numpy as np
import torch

DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


def load(path):
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if not isinstance(obj, h5py.Dataset):
                return
            data = obj[()]
            declared = obj.attrs.get("dtype")
            declared = declared.decode() if isinstance(declared, bytes) else declared
            if data.dtype == np.uint16 and declared == "bfloat16":
                t = torch.from_numpy(data.astype(np.int16)).view(torch.bfloat16)
            else:
                t = torch.from_numpy(np.ascontiguousarray(data))
            out[name] = t.contiguous()
        f.visititems(visit)
    return out


def write_file(path, tensors):
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    header = {"__metadata__": {"format": "pt", "writer": "tests/reference"}}
    at = 0
    blobs = []
    for name in order:
        t = tensors[name]
        raw = t.view(torch.int16 if t.element_size() == 2 else torch.int32).numpy()
        raw = raw.astype(raw.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("out")
    ap.add_argument("--shards", type=int, default=1)
    a = ap.parse_args()
    tensors = load(a.checkpoint)
    if a.shards <= 1:
        write_file(a.out, tensors)
        return
    os.makedirs(a.out, exist_ok=True)
    names = sorted(tensors)
    weight_map, total = {}, 0
    for s in range(a.shards):
        part = names[s::a.shards]  # round robin: every file holds all kinds
        fname = f"model-{s + 1:05d}-of-{a.shards:05d}.safetensors"
        write_file(os.path.join(a.out, fname), {k: tensors[k] for k in part})
        for k in part:
            weight_map[k] = fname
            total += tensors[k].numel() * tensors[k].element_size()
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


if __name__ == "__main__":
    main()

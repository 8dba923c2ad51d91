#!/usr/bin/env python3
"""make_bad_st.py --list | CASE GOOD.safetensors GOOD_DIR OUT

Test helper for the safetensors rejection tests (run_io.sh bad-st): write
OUT, a copy of a good checkpoint broken the way CASE says (with the format's
own rules, standard library only), and print the message fragments refit must
report for it, one per line. GOOD_DIR is a sharded copy of the same
checkpoint (an index and two files), for the index cases.
"""
import json
import os
import shutil
import struct
import sys

CASES = ["short", "over-bound", "past-end", "malformed", "non-utf8", "duplicate",
         "dtype-unknown", "dtype-int", "shape-offsets", "out-of-range", "overlap",
         "hole", "metadata", "missing-and-shape", "index-missing-file",
         "index-missing-tensor", "fifo", "index-fifo", "index-shard-fifo"]


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def write(path, header, data, text=None):
    raw = text if text is not None else json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data)


def tensors(header):
    """Names by data offset."""
    names = [k for k in header if k != "__metadata__"]
    return sorted(names, key=lambda k: header[k]["data_offsets"][0])


def main():
    if sys.argv[1:] == ["--list"]:
        print(" ".join(CASES))
        return
    case, good, good_dir, out = sys.argv[1:5]
    h, data = read(good)
    names = tensors(h)
    # Two tensors of equal size, the first and second 2-D ones by offset.
    mats = [k for k in names if len(h[k]["shape"]) == 2]
    a, b = mats[0], mats[1]
    last = names[-1]
    want = []
    if case == "short":
        open(out, "wb").write(b"\x10\x00\x00")
        want = ["too short for the 8-byte header length"]
    elif case == "over-bound":
        open(out, "wb").write(struct.pack("<Q", 200_000_000) + b"{}" * 8)
        want = ["header length 200000000 is over the format's bound of 100000000"]
    elif case == "past-end":
        open(out, "wb").write(struct.pack("<Q", 4096) + b"{}      ")
        want = ["header length 4096 runs past the end of the 16-byte file"]
    elif case == "malformed":
        write(out, None, data, text=b'{"a": {"dtype": "BF16",')
        want = ["header is not valid UTF-8 JSON"]
    elif case == "non-utf8":
        text = json.dumps(h).encode().replace(a.encode(), a.encode()[:-1] + b"\xff", 1)
        write(out, None, data, text=text)
        want = ["header is not valid UTF-8 JSON", "UTF-8"]
    elif case == "duplicate":
        text = json.dumps(h).encode()
        entry = json.dumps({a: h[a]})[1:-1].encode()
        text = text[:-1] + b", " + entry + b"}"
        write(out, None, data, text=text)
        want = ["duplicate object key"]
    elif case == "dtype-unknown":
        h[a]["dtype"] = "Q4_K"
        write(out, h, data)
        want = [f"tensor '{a}': unknown dtype \"Q4_K\""]
    elif case == "dtype-int":
        h[a]["dtype"] = "I16"
        write(out, h, data)
        want = [f"tensor '{a}' has dtype I16; expected BF16, F16 or F32"]
    elif case == "shape-offsets":
        h[a]["shape"] = [h[a]["shape"][0], h[a]["shape"][1] + 1]
        write(out, h, data)
        want = [f"tensor '{a}': shape and dtype BF16 make"]
    elif case == "out-of-range":
        h[last]["data_offsets"][1] += 64
        h[last]["shape"] = [h[last]["shape"][0] + 32] + h[last]["shape"][1:] \
            if len(h[last]["shape"]) == 1 else h[last]["shape"]
        write(out, h, data)
        want = [f"tensor '{last}': data_offsets", "end past the"]
    elif case == "overlap":
        size = h[a]["data_offsets"][1] - h[a]["data_offsets"][0]
        h[b]["data_offsets"] = [h[a]["data_offsets"][0] + size // 2,
                                h[a]["data_offsets"][0] + size // 2 + h[b]["data_offsets"][1]
                                - h[b]["data_offsets"][0]]
        write(out, h, data)
        want = ["overlaps"]
    elif case == "hole":
        for k in names:
            h[k]["data_offsets"] = [o + 16 for o in h[k]["data_offsets"]]
        write(out, h, b"\0" * 16 + data)
        want = ["bytes [0, 16) of the data belong to no tensor"]
    elif case == "metadata":
        h["__metadata__"] = {"format": 1}
        write(out, h, data)
        want = ["__metadata__ 'format' is not a string"]
    elif case == "missing-and-shape":
        # Two problems at once: a tensor renamed away, another reshaped.
        h[a + ".renamed"] = h.pop(a)
        rows, cols = h[b]["shape"]
        h[b]["shape"] = [rows * cols]
        write(out, h, data)
        want = ["2 problems", f"tensor '{a}' is missing",
                f"tensor '{b}' has shape [{rows * cols}], expected [{rows}, {cols}]"]
    elif case == "index-missing-file":
        shutil.copytree(good_dir, out)
        index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
        index["weight_map"][a] = "model-00009-of-00002.safetensors"
        json.dump(index, open(os.path.join(out, "model.safetensors.index.json"), "w"))
        want = [os.path.join(out, "model-00009-of-00002.safetensors") +
                ": cannot open the safetensors file: No such file or directory"]
    elif case == "index-missing-tensor":
        shutil.copytree(good_dir, out)
        index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
        del index["weight_map"][a]
        json.dump(index, open(os.path.join(out, "model.safetensors.index.json"), "w"))
        want = [f"tensor '{a}' is missing from weight_map"]
    elif case == "fifo":
        # A FIFO opened for reading waits for a writer: refused by name, at once.
        os.mkfifo(out)
        want = [f"{out}: the safetensors file is a FIFO, not a regular file"]
    elif case == "index-fifo":
        os.mkdir(out)
        os.mkfifo(os.path.join(out, "model.safetensors.index.json"))
        want = [os.path.join(out, "model.safetensors.index.json") +
                ": the safetensors index is a FIFO, not a regular file"]
    elif case == "index-shard-fifo":
        shutil.copytree(good_dir, out)
        index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
        shard = index["weight_map"][a]
        os.remove(os.path.join(out, shard))
        os.mkfifo(os.path.join(out, shard))
        want = [os.path.join(out, shard) +
                ": the safetensors file is a FIFO, not a regular file"]
    else:
        sys.exit(f"make_bad_st: unknown case {case}")
    print("\n".join(want))


if __name__ == "__main__":
    main()

"""The NVFP4 C reference (kernels/nvfp4.c) against the independent statement
of the rule in vllm_rules.nvfp4_* (docs/nvfp4.md).

    test_nvfp4_kernel.py TOOL

TOOL is tests/kernels/nvfp4_tool (the C reference as a command). Every case
compares, byte for byte, the packed E2M1 values, the E4M3 block scales and
the global scale words. The cases: random weights of many shapes (partial
blocks, odd K), adversarial blocks (zeros, signed zeros, BF16 subnormals,
huge and mixed magnitudes, +-Inf, NaN), exact E2M1 ties under a global scale
of 1, every BF16 amax as a block's amax under several global scales, the
global scale of every BF16 amax, and shards: row and column slices (a column
slice on a block boundary, and one that splits a block) quantized with the
global scale of the whole tensor, no one of them holding it whole. Each run
draws a new seed (printed; REFIT_TEST_SEED=N repeats it).
"""

import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_rules  # noqa: E402
from test_fp8_block_kernel import bf16, weights  # noqa: E402


def f32_bits(v):
    return int(np.array(v, dtype=np.float32).view(np.uint32))


def run_tool(tool, work, bits, gsf=None):
    rows, k = bits.shape
    src, q, s, g = (os.path.join(work, n) for n in ("in.bin", "q.bin", "s.bin", "g.bin"))
    np.ascontiguousarray(bits).astype("<u2").tofile(src)
    cmd = [tool, str(rows), str(k), src, q, s, g]
    if gsf is not None:
        cmd.append(f"{f32_bits(gsf):08x}")
    subprocess.run(cmd, check=True)
    return (np.fromfile(q, dtype=np.uint8).reshape(rows, (k + 1) // 2),
            np.fromfile(s, dtype=np.uint8).reshape(rows, -(-k // 16)),
            np.fromfile(g, dtype="<u4"))


def first_diff(name, what, got, want, bits=None):
    i = tuple(np.argwhere(got != want)[0])
    extra = ""
    if bits is not None and what == "value":
        c = 2 * i[1]
        extra = f" (inputs 0x{bits[i[0], c]:04x}" + (
            f", 0x{bits[i[0], c + 1]:04x})" if c + 1 < bits.shape[1] else ")")
    print(f"FAIL {name}: {what} {i}{extra}: expected 0x{int(want[i]):02x}, actual "
          f"0x{int(got[i]):02x} ({int((got != want).sum())} of {got.size} differ)")


def compare(tool, work, name, bits, gsf=None):
    """The tool's bytes against the statement; gsf None: the tensor's own."""
    q, s, g = run_tool(tool, work, bits, gsf)
    amax = vllm_rules.nvfp4_amax(bits)
    own, decode = vllm_rules.nvfp4_global_scale(amax)
    use = own if gsf is None else np.float32(gsf)
    want_q, want_s = vllm_rules.nvfp4_quantize(bits, use)
    want_g = np.array([int(bf16(amax)), f32_bits(use), f32_bits(np.float32(1.0) / use)],
                      dtype=np.uint32)
    bad = 0
    if gsf is None and f32_bits(decode) != want_g[2]:
        raise AssertionError("the statement's weight_scale_2 disagrees with itself")
    if not np.array_equal(g, want_g):
        print(f"FAIL {name}: global words (key, gsf, weight_scale_2) expected "
              f"{[hex(v) for v in want_g]}, actual {[hex(v) for v in g]}")
        bad += 1
    if not np.array_equal(s, want_s):
        first_diff(name, "scale", s, want_s)
        bad += 1
    if not np.array_equal(q, want_q):
        first_diff(name, "value", q, want_q, bits)
        bad += 1
    print(f"{'ok  ' if bad == 0 else 'FAIL'} {name} {bits.shape}")
    return bad


def adversarial(rng, rows, k):
    """Random weights with a different adversarial pattern in every block of
    16; the whole tensor's amax is then one of the huge values."""
    b = weights(rng, rows, k)
    kinds = 0
    for r in range(rows):
        for c0 in range(0, k, 16):
            blk = b[r, c0:c0 + 16]
            kind = kinds % 11
            kinds += 1
            if kind == 0:  # signed zeros
                blk[:] = np.where(rng.random(blk.shape) < 0.5, 0x0000, 0x8000)
            elif kind == 1:  # BF16 subnormals only
                blk[:] = rng.integers(1, 0x80, size=blk.shape) | (
                    rng.integers(0, 2, size=blk.shape) << 15)
            elif kind == 2:  # tiny normals next to zeros
                tiny = rng.integers(0x0080, 0x0800, size=blk.shape)
                blk[:] = np.where(rng.random(blk.shape) < 0.3, 0, tiny)
            elif kind == 3:  # one huge value, the rest tiny
                blk[:] = bf16(rng.standard_normal(blk.shape).astype(np.float32) *
                              np.float32(1e-20))
                blk[rng.integers(blk.size)] = 0x7F7F if rng.random() < 0.2 else 0x5F00
            elif kind == 4:  # mixed magnitudes over the whole BF16 range
                blk[:] = rng.integers(0, 0x7F80, size=blk.shape) | (
                    rng.integers(0, 2, size=blk.shape) << 15)
            elif kind == 5:  # one value, negative
                blk[:] = 0x8000 | rng.integers(0x0001, 0x7F80)
            elif kind == 6:  # a NaN among ordinary values
                blk[rng.integers(blk.size)] = 0x7FC0 | (rng.integers(0, 2) << 15)
            elif kind == 7:  # only NaN and zeros
                blk[:] = np.where(rng.random(blk.shape) < 0.5, 0xFFC1, 0x0000)
            elif kind == 8:  # magnitudes spanning 2^40
                blk[:] = bf16(np.exp2(rng.uniform(-20, 20, size=blk.shape)).astype(np.float32))
            # kinds 9, 10: left as random weights
    return b


def infinite(rng, rows, k):
    b = weights(rng, rows, k)
    b[rng.integers(rows), rng.integers(k)] = 0x7F80
    b[rng.integers(rows), rng.integers(k)] = 0xFF80
    return b


def ties(rng, rows):
    """Blocks of vmax 6 * 2^j whose other elements are the E2M1 midpoints
    times 2^j: under gsf = 1 the scale is 2^j exactly and every element a
    tie (or an E2M1 value), so ties to even are checked, not hoped for."""
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 3.0, 4.0,
                     0.0, 0.125, 5.5, 6.0], dtype=np.float32)
    out = np.empty((rows, 16), dtype=np.uint16)
    for r in range(rows):
        j = rng.integers(-8, 7)
        v = np.concatenate([[6.0], rng.permutation(mids)]).astype(np.float32)
        v *= np.where(rng.random(16) < 0.5, -1, 1).astype(np.float32)
        out[r] = bf16(v * np.float32(2.0 ** j))
    return out


def every_block_amax(rng):
    """Row r is one block whose amax key is r (0x0000 .. 0x7F80), the other
    elements random below it."""
    keys = np.arange(0x7F81, dtype=np.uint16)
    frac = rng.random((keys.size, 16))
    vals = bf16((keys.astype(np.uint32) << 16).view(np.float32)[:, None] *
                frac.astype(np.float32))
    vals = np.minimum(vals & 0x7FFF, keys[:, None]) | (
        rng.integers(0, 2, size=vals.shape) << 15).astype(np.uint16)
    vals[:, 0] = keys | (rng.integers(0, 2, size=keys.size) << 15).astype(np.uint16)
    return vals


def every_global(tool, work):
    out = os.path.join(work, "globals.bin")
    subprocess.run([tool, "globals", out], check=True)
    got = np.fromfile(out, dtype="<u4").reshape(0x8000, 2)
    bad = 0
    for key in range(0x8000):
        amax = np.array([key << 16], dtype=np.uint32).view(np.float32)[0]
        if np.isnan(amax):
            continue  # a NaN never is an amax key
        gsf, dec = vllm_rules.nvfp4_global_scale(amax)
        want = (f32_bits(gsf), f32_bits(dec))
        if tuple(got[key]) != want:
            if bad == 0:
                print(f"FAIL every BF16 amax: key 0x{key:04x}: expected "
                      f"{[hex(v) for v in want]}, actual {[hex(v) for v in got[key]]}")
            bad += 1
    print(f"{'ok  ' if bad == 0 else 'FAIL'} global scale of every BF16 amax")
    return int(bad > 0)


def shards(tool, work, rng):
    """A tensor split four ways by rows and three by columns: every shard is
    quantized by the tool with the global scale of the whole tensor (which
    no shard holds) and must equal its slice of the whole tensor's bytes.
    Column cuts at 48 and 96 keep blocks whole. A shard cut at column 40
    splits a block, so its blocks are not the tensor's (the runtime must
    assemble whole blocks first); it is checked against the statement
    applied to the shard under the whole tensor's global scale."""
    bad = 0
    rows, k = 24, 160
    full = adversarial(rng, rows, k)
    full[rng.integers(rows), rng.integers(k)] = bf16(np.float32(rng.uniform(50, 90)))
    amax = vllm_rules.nvfp4_amax(full)
    gsf, _ = vllm_rules.nvfp4_global_scale(amax)
    want_q, want_s = vllm_rules.nvfp4_quantize(full, gsf)
    keys = []
    for r0, r1 in ((0, 6), (6, 12), (12, 18), (18, 24)):
        for c0, c1 in ((0, 48), (48, 96), (96, 160)):
            part = np.ascontiguousarray(full[r0:r1, c0:c1])
            q, s, g = run_tool(tool, work, part, gsf)
            keys.append(int(g[0]))
            if not (np.array_equal(q, want_q[r0:r1, c0 // 2:c1 // 2]) and
                    np.array_equal(s, want_s[r0:r1, c0 // 16:c1 // 16])):
                print(f"FAIL shard rows {r0}:{r1} cols {c0}:{c1}: bytes differ from "
                      f"the whole tensor's")
                bad += 1
    # The global amax is the integer maximum of the shards' keys.
    if max(keys) != int(bf16(amax)):
        print(f"FAIL shards: max of shard keys 0x{max(keys):04x}, whole tensor "
              f"0x{int(bf16(amax)):04x}")
        bad += 1
    part = np.ascontiguousarray(full[:, 40:160])
    bad += compare(tool, work, "shard splitting a block, whole gsf", part, gsf)
    print(f"{'ok  ' if bad == 0 else 'FAIL'} shards of a tensor no rank holds whole")
    return bad


def main():
    tool = sys.argv[1]
    seed = int(os.environ.get("REFIT_TEST_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
    print(f"test_nvfp4_kernel: seed {seed} (REFIT_TEST_SEED={seed} repeats it)")
    rng = np.random.default_rng(seed)
    bad = 0
    with tempfile.TemporaryDirectory() as work:
        for shape in [(1, 16), (1, 1), (3, 32), (128, 256), (200, 130), (7, 33),
                      (5, 15), (64, 4104), (300, 48)]:
            bad += compare(tool, work, "random", weights(rng, *shape))
        for shape in [(40, 176), (33, 250), (3, 1001)]:
            bad += compare(tool, work, "adversarial", adversarial(rng, *shape))
        bad += compare(tool, work, "infinities", infinite(rng, 20, 64))
        bad += compare(tool, work, "ties, gsf 1", ties(rng, 400), np.float32(1.0))
        blocks = every_block_amax(rng)
        for gsf in (np.float32(1.0), np.float32(2688.0 / 3.0), np.float32(1e-30),
                    np.float32(3.0e35), np.float32(np.inf)):
            bad += compare(tool, work, f"every BF16 block amax, gsf {gsf:g}", blocks, gsf)
        bad += every_global(tool, work)
        bad += shards(tool, work, rng)
    print("test_nvfp4_kernel:", "all passed" if bad == 0 else f"{bad} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""The block FP8 C reference (kernels/fp8_block.c) against the independent
statement of the rule in vllm_rules.fp8_block_quantize.

    test_fp8_block_kernel.py TOOL

TOOL is tests/kernels/fp8_block_tool (the C reference as a command). Every
case is run in both scale modes and compared byte for byte: the E4M3 values
and the FP32 scale_inv bits. The cases: random weights of many shapes (full
and partial blocks, a band wider than 64 block columns), adversarial blocks
(all zeros, signed zeros, BF16 subnormals, values so small that 1/amax
overflows, huge and mixed magnitudes, +-Inf, amax exactly 448 * 2^k and
1.75 * 2^k, the tensor's last element as the largest of a partial block or
zero), every finite BF16 value as a block's amax, and the NaN rule. Each run
draws a new seed (printed; REFIT_TEST_SEED=N repeats it).
"""

import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_rules  # noqa: E402


def bf16(x):
    """float32 values to BF16 bit patterns, round to nearest even."""
    x = np.asarray(x, dtype=np.float32)
    u = np.atleast_1d(x).view(np.uint32).astype(np.uint64)
    s16, one, half = np.uint64(16), np.uint64(1), np.uint64(0x7FFF)
    u = (u + half + ((u >> s16) & one)) >> s16
    return u.astype(np.uint16).reshape(x.shape)


def weights(rng, rows, k):
    """Trained-weight-like values: normal, per-row spread, a few outliers."""
    x = rng.standard_normal((rows, k)).astype(np.float32) * np.float32(0.02)
    x *= np.exp2(rng.integers(-3, 4, size=(rows, 1))).astype(np.float32)
    hot = rng.random((rows, k)) < 0.001
    x[hot] *= np.float32(300.0)
    return bf16(x)


def run_tool(tool, work, mode, bits):
    rows, k = bits.shape
    src, q, s = (os.path.join(work, n) for n in ("in.bin", "q.bin", "s.bin"))
    bits.astype("<u2").tofile(src)
    subprocess.run([tool, mode, str(rows), str(k), src, q, s], check=True)
    nbr, nbc = -(-rows // 128), -(-k // 128)
    return (np.fromfile(q, dtype=np.uint8).reshape(rows, k),
            np.fromfile(s, dtype="<u4").reshape(nbr, nbc))


def compare(tool, work, name, bits):
    bad = 0
    for mode in ("fp32", "pow2"):
        q, s = run_tool(tool, work, mode, bits)
        want_q, want_s = vllm_rules.fp8_block_quantize(bits, pow2=mode == "pow2")
        want_s = want_s.astype(np.float32).view(np.uint32)
        if not np.array_equal(s, want_s):
            i = np.argwhere(s != want_s)[0]
            print(f"FAIL {name} [{mode}]: scale_inv block {tuple(i)}: expected "
                  f"0x{want_s[tuple(i)]:08x}, actual 0x{s[tuple(i)]:08x} "
                  f"({int((s != want_s).sum())} of {s.size} scales differ)")
            bad += 1
        if not np.array_equal(q, want_q):
            i = np.argwhere(q != want_q)[0]
            print(f"FAIL {name} [{mode}]: value {tuple(i)} (input 0x{bits[tuple(i)]:04x}): "
                  f"expected 0x{want_q[tuple(i)]:02x}, actual 0x{q[tuple(i)]:02x} "
                  f"({int((q != want_q).sum())} of {q.size} values differ)")
            bad += 1
    print(f"{'ok  ' if bad == 0 else 'FAIL'} {name} {bits.shape}")
    return bad


def adversarial(rng, rows, k):
    """Random weights with a different adversarial pattern in every block."""
    b = weights(rng, rows, k)
    nbr, nbc = -(-rows // 128), -(-k // 128)
    kinds = 0
    for br in range(nbr):
        for bc in range(nbc):
            blk = b[br * 128:(br + 1) * 128, bc * 128:(bc + 1) * 128]
            kind = kinds % 10
            kinds += 1
            if kind == 0:  # all zeros, some negative
                blk[:] = np.where(rng.random(blk.shape) < 0.5, 0x0000, 0x8000)
            elif kind == 1:  # BF16 subnormals only: 1/amax overflows
                blk[:] = rng.integers(0, 0x80, size=blk.shape) | (
                    rng.integers(0, 2, size=blk.shape) << 15)
            elif kind == 2:  # tiny normals and zeros: 448/amax overflows
                tiny = rng.integers(0x0080, 0x0400, size=blk.shape)
                blk[:] = np.where(rng.random(blk.shape) < 0.3, 0, tiny)
            elif kind == 3:  # huge next to tiny
                blk[:] = bf16(rng.standard_normal(blk.shape).astype(np.float32) * np.float32(1e-30))
                blk.flat[rng.integers(blk.size)] = 0x7F7F  # largest finite BF16
            elif kind == 4:  # an infinity among ordinary values
                blk.flat[rng.integers(blk.size)] = 0xFF80 if rng.random() < 0.5 else 0x7F80
            elif kind == 5:  # amax exactly 448 * 2^e: scale is a power of two
                blk.flat[rng.integers(blk.size)] = bf16(np.float32(448.0) * np.float32(2.0 ** rng.integers(-20, 20)))
            elif kind == 6:  # amax 1.75 * 2^e: amax / 448 an exact power of two
                blk.flat[rng.integers(blk.size)] = bf16(np.float32(1.75) * np.float32(2.0 ** rng.integers(-30, 30)))
            elif kind == 7:  # mixed magnitudes over the whole BF16 range
                blk[:] = rng.integers(0, 0x7F80, size=blk.shape) | (
                    rng.integers(0, 2, size=blk.shape) << 15)
            elif kind == 8:  # one value, negative
                blk[:] = 0x8000 | rng.integers(0x0001, 0x7F80)
            # kind 9: left as random weights
    return b


def every_amax(tool, work):
    """The scale rule on every BF16 amax key (0x0000 .. 0x7FFF, NaN patterns
    included), through the tool's `scales` mode."""
    bad = 0
    keys = np.arange(0x8000, dtype=np.uint32)
    amax = (keys << np.uint32(16)).view(np.float32)
    for mode in ("fp32", "pow2"):
        out = os.path.join(work, "scales.bin")
        subprocess.run([tool, "scales", mode, out], check=True)
        got = np.fromfile(out, dtype="<u4").reshape(0x8000, 2)
        scale, scale_inv = vllm_rules.fp8_block_scales(amax, mode == "pow2")
        want = np.stack([scale.view(np.uint32), scale_inv.view(np.uint32)], axis=1)
        # A NaN scale is any NaN for the elements; scale_inv's bits are stored.
        nan = np.isnan(scale)
        diff = np.argwhere((got != want) & ~(nan[:, None] & (np.arange(2) == 0)))
        if len(diff):
            k, which = diff[0]
            print(f"FAIL every BF16 amax [{mode}]: amax 0x{k:04x}: "
                  f"{('scale', 'scale_inv')[which]} expected 0x{want[k, which]:08x}, "
                  f"actual 0x{got[k, which]:08x} ({len(diff)} differ)")
            bad += 1
    print(f"{'ok  ' if bad == 0 else 'FAIL'} every BF16 amax (0x0000 .. 0x7fff)")
    return bad


def main():
    tool = sys.argv[1]
    seed = int(os.environ.get("REFIT_TEST_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
    print(f"test_fp8_block_kernel: seed {seed} (REFIT_TEST_SEED={seed} repeats it)")
    rng = np.random.default_rng(seed)
    bad = 0
    with tempfile.TemporaryDirectory() as work:
        for shape in [(128, 128), (256, 384), (200, 130), (130, 256), (576, 300),
                      (1, 1), (127, 129), (3, 1000), (130, 8300)]:
            bad += compare(tool, work, "random", weights(rng, *shape))
        for shape in [(640, 640), (300, 1100), (129, 1281)]:
            bad += compare(tool, work, "adversarial", adversarial(rng, *shape))
        # The last element is the largest of every partial block: the padding
        # decides their scales.
        b = weights(rng, 200, 300)
        b[-1, -1] = bf16(np.float32(37.5))
        bad += compare(tool, work, "loud last element", b)
        b = weights(rng, 200, 300)
        b[-1, -1] = 0x8000
        bad += compare(tool, work, "zero last element", b)
        # A partial block of zeros padded with a non-zero last element.
        b = np.zeros((130, 130), dtype=np.uint16)
        b[-1, -1] = bf16(np.float32(-3.0))
        bad += compare(tool, work, "zeros padded with a value", b)
        bad += every_amax(tool, work)
        # refit's NaN rule (outside the upstream contract): the block is NaN.
        b = weights(rng, 256, 256)
        b[5, 200] = 0x7FC1
        b[130, 3] = 0xFFC0
        bad += compare(tool, work, "NaN blocks", b)
        b = weights(rng, 130, 130)
        b[-1, -1] = 0x7FC0
        bad += compare(tool, work, "NaN last element", b)
    if bad:
        print(f"test_fp8_block_kernel: FAIL: {bad} comparisons differ (seed {seed})")
        return 1
    print("test_fp8_block_kernel: all cases agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())

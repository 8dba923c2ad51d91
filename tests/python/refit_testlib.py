"""Shared pieces of the Python tests: configs, fresh weights per version
made by torch, a torch module carrying Megatron-Core's parameter names, and
bfloat16 bits between torch and numpy.

The expected generator bytes come from tests/reference/vllm_rules.py and
the trainer's Megatron tensors from tests/caller/megatron_rules.py: both
statements of the frameworks' rules that share nothing with refit's catalog.
"""

import os
import sys

import numpy as np
import torch
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "tests", "reference"), os.path.join(ROOT, "tests", "caller")]
import vllm_rules  # noqa: E402


def config():
    """The job config this run was launched with (REFIT_TEST_CONFIG)."""
    path = os.environ["REFIT_TEST_CONFIG"]
    with open(path) as f:
        return path, yaml.safe_load(f)


def bits(t):
    """torch bfloat16 -> numpy uint16 bit patterns (a copy)."""
    return t.detach().cpu().contiguous().view(torch.int16).numpy().view(np.uint16).copy()


def from_bits(a):
    """numpy uint16 bit patterns -> a new torch bfloat16 tensor."""
    return torch.from_numpy(np.ascontiguousarray(a).view(np.int16).copy()).view(torch.bfloat16)


def full_weights(cfg, seed, version):
    """Every Hugging Face tensor of the model for `version`, made by torch
    (the same on every rank): numpy uint16 bfloat16 bits."""
    g = torch.Generator().manual_seed(seed * 1000 + version)
    out = {}
    for name, shape in vllm_rules.hf_tensor_shapes(cfg).items():
        norm = "norm" in name
        v = torch.randn(shape, generator=g) * (0.05 if norm else 0.02) + (1.0 if norm else 0.0)
        out[name] = bits(v.to(torch.bfloat16))
    return out


class NamedModel(torch.nn.Module):
    """A torch module whose named_parameters() are exactly the given dotted
    names (Megatron-Core's: decoder.layers.0.self_attention.linear_qkv.weight,
    ...), built as the nested submodules such names imply."""

    def __init__(self, tensors, requires_grad=False):
        super().__init__()
        for name, value in tensors.items():
            *path, leaf = name.split(".")
            m = self
            for part in path:
                if not hasattr(m, part):
                    m.add_module(part, torch.nn.Module())
                m = getattr(m, part)
            m.register_parameter(leaf, torch.nn.Parameter(value, requires_grad=requires_grad))


def compare(got, want, what):
    """Byte-for-byte comparison of a torch or numpy runtime tensor with the
    bytes vLLM holds; an AssertionError naming the first difference."""
    if isinstance(got, torch.Tensor):
        got = got.detach().cpu().contiguous().view(torch.uint8).numpy()
    g = np.ascontiguousarray(got).reshape(-1).view(np.uint8)
    w = np.ascontiguousarray(want).reshape(-1).view(np.uint8)
    assert g.size == w.size, "%s: %d bytes, vLLM holds %d" % (what, g.size, w.size)
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, "%s: %d of %d bytes differ, first at byte %d: %d, expected %d" % (
        what, bad.size, g.size, bad[0], g[bad[0]], w[bad[0]])


def torch_like(shape, dtype):
    """An engine's runtime tensor for refit's (shape, dtype): torch
    bfloat16, or uint8 for the float8 types (as engines pass them)."""
    name = str(dtype).replace("torch.", "")  # torch.dtype or refit's name (expected())
    return torch.zeros(shape, dtype=torch.bfloat16 if name == "bfloat16" else torch.uint8)


def ranks(cfg):
    t = cfg.get("trainer", {})
    return t.get("tp", 1) * t.get("pp", 1) * t.get("dp", 1), cfg.get("generator", {}).get("tp", 1)

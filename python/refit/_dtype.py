"""Element types as PyTorch names them: expected() gives torch.dtype where
the program uses torch (imported it) and torch has the type (torch.bfloat16;
torch.float8_e4m3fn and torch.float8_e8m0fnu from PyTorch 2.1 and 2.7), else
refit's name for it ("float8_e4m3fn"). dtype_name() reads either back.

refit never imports torch itself where the caller did not: its import takes
seconds of CPU on every rank, which a numpy-only program should not pay."""

import sys

NAMES = ("bfloat16", "float8_e4m3fn", "float8_e8m0fnu", "float32", "uint8")


def torch_if_used():
    """The torch module where this program imported it, else None."""
    return sys.modules.get("torch")


def framework(name):
    """torch's dtype of refit's element type `name`, where the program uses
    torch and torch has the type."""
    torch = torch_if_used()
    return name if torch is None else getattr(torch, name, name)


def dtype_name(dtype):
    """refit's name of an element type given as torch.dtype, a numpy dtype
    name or refit's name: "bfloat16", "float8_e4m3fn", ..."""
    return str(dtype).replace("torch.", "")

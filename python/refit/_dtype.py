"""Element types as PyTorch names them: expected() gives torch.dtype where
torch is present and has the type (torch.bfloat16; torch.float8_e4m3fn and
torch.float8_e8m0fnu from PyTorch 2.1 and 2.7), else refit's name for it
("float8_e4m3fn"). dtype_name() reads either back."""

NAMES = ("bfloat16", "float8_e4m3fn", "float8_e8m0fnu", "float32", "uint8")


def framework(name):
    """torch's dtype of refit's element type `name`, where torch has it."""
    try:
        import torch
    except ImportError:
        return name
    return getattr(torch, name, name)


def dtype_name(dtype):
    """refit's name of an element type given as torch.dtype, a numpy dtype
    name or refit's name: "bfloat16", "float8_e4m3fn", ..."""
    return str(dtype).replace("torch.", "")

"""torch tensors and numpy arrays <-> refit_tensor_t: what the caller's
object is (pointer, bytes, shape, refit dtype, device), the checks that only
Python can make before C sees a bare pointer (contiguity, device, element
type), and zero-copy views of refit's memory.

refit's dtypes and the framework types that carry them:
  bfloat16        torch.bfloat16; numpy uint16 (bit patterns)
  float8_e4m3fn   torch.float8_e4m3fn where torch has it; torch/numpy uint8
  float8_e8m0fnu  torch.float8_e8m0fnu where torch has it; torch/numpy uint8
  float32         torch.float32; numpy float32 (DeepSeek's e_score_correction_bias,
                  block FP8's weight_scale_inv)
  uint8           torch/numpy uint8 (NVFP4's weight: E2M1 values two to a byte)
uint8 also stands for either float8 type: PyTorch's DLPack export refuses float8,
so engines pass uint8 views of them.
"""

import ctypes

import numpy as np

from . import _lib
from ._dtype import torch_if_used
from .errors import error

_BYTE_TYPES = ("float8_e4m3fn", "float8_e8m0fnu")


class Described:
    """A caller's tensor as refit sees it."""

    def __init__(self, ptr, nbytes, shape, dtype, device, contiguous, writable, text):
        self.ptr, self.nbytes, self.shape, self.dtype = ptr, nbytes, shape, dtype
        self.device, self.contiguous, self.writable, self.text = (
            device, contiguous, writable, text)


def _torch_dtype(t):
    torch = torch_if_used()
    if t.dtype == torch.bfloat16:
        return "bfloat16"
    if t.dtype == torch.uint8:
        return "uint8"
    for name in _BYTE_TYPES:
        if getattr(torch, name, None) is not None and t.dtype == getattr(torch, name):
            return name
    return str(t.dtype).replace("torch.", "")


def describe(obj):
    """Pointer, size, shape, dtype and device of a torch tensor or numpy
    array; TypeError for anything else."""
    torch = torch_if_used()  # a torch tensor means torch is imported
    if torch is not None and isinstance(obj, torch.Tensor):
        dev = obj.device.index if obj.device.type == "cuda" else -1
        if obj.device.type not in ("cpu", "cuda"):
            dev = None
        where = "host" if dev == -1 else str(obj.device)
        return Described(obj.data_ptr(), obj.numel() * obj.element_size(),
                         tuple(obj.shape), _torch_dtype(obj), dev, obj.is_contiguous(),
                         True, "torch %s %s on %s" % (
                             str(obj.dtype).replace("torch.", ""), list(obj.shape), where))
    if isinstance(obj, np.ndarray):
        dtype = {np.dtype(np.uint16): "bfloat16(uint16)",
                 np.dtype(np.uint8): "uint8"}.get(obj.dtype, str(obj.dtype))
        return Described(obj.ctypes.data, obj.nbytes, tuple(obj.shape), dtype, -1,
                         obj.flags.c_contiguous, obj.flags.writeable,
                         "numpy %s %s" % (obj.dtype, list(obj.shape)))
    raise TypeError("refit: expected a torch.Tensor or numpy.ndarray, got %s"
                    % type(obj).__name__)


def fingerprint(obj):
    """What begin() compares with the registration: pointer, bytes, dtype,
    layout and device of the caller's object as it is now. A swapped or
    resized storage (model.float(); model.bfloat16(), module.to(),
    param.data = ..., resize_) changes it."""
    d = describe(obj)
    return (d.ptr, d.nbytes, d.dtype, d.contiguous, d.device)


def storage_of(obj):
    """The object that owns `obj`'s memory: held while refit may touch it,
    so that a storage the caller swapped away is not freed under refit."""
    torch = torch_if_used()  # a torch tensor means torch is imported
    if torch is not None and isinstance(obj, torch.Tensor):
        get = getattr(obj, "untyped_storage", None) or obj.storage
        return get()
    return obj


def shape_ok(got, want):
    """refit_tensor_register's rule: the same shape, or [n] for [1, n] (a
    norm) or for [n, 1] (a bias, which refit keeps as one column)."""
    got, want = tuple(got), tuple(want)
    return got == want or (len(want) == 2 and want[0] == 1 and got == (want[1],)) or (
        len(want) == 2 and want[1] == 1 and got == (want[0],))


def framework_shape(name, shape):
    """The shape a framework holds for refit's (name, shape): refit keeps a
    norm weight as one row, [1, n], and a bias as one column, [n, 1] (split
    and fused by rows as its weight); torch modules hold [n]."""
    shape = tuple(shape)
    leaf = name.rsplit(".", 1)[-1]
    if len(shape) == 2 and shape[0] == 1 and ("norm" in name or leaf == "bias"):
        return (shape[1],)
    if len(shape) == 2 and shape[1] == 1 and leaf == "bias":
        return (shape[0],)
    return shape


def _dtype_ok(actual, expected):
    if actual in ("bfloat16", "bfloat16(uint16)"):
        return expected == "bfloat16"
    if actual == "uint8":
        return expected in _BYTE_TYPES or expected == "uint8"
    return actual == expected


def engine_form(d, expected_dtype):
    """The dtype a generator registration is checked as: its own when it is
    the other precision's form of the expected one (bfloat16 for an e4m3
    weight, e4m3 for a bfloat16 one), which refit_tensor_register judges."""
    if expected_dtype == "float8_e4m3fn" and d.dtype in ("bfloat16", "bfloat16(uint16)"):
        return "bfloat16"
    if expected_dtype == "bfloat16" and d.dtype in ("uint8", "float8_e4m3fn"):
        return "float8_e4m3fn"
    return expected_dtype


def where_text(device):
    if device is None:
        return "a device refit does not use"
    return "host memory" if device < 0 else "cuda:%d" % device


def check(name, d, expected_dtype, side, session_device):
    """Refuse what C cannot see behind a bare pointer: a layout other than
    row-major contiguous, an element type that is not the expected one,
    memory on the wrong device, read-only memory refit must write.
    refit_tensor_register then checks name, shape, size and memory itself.
    session_device is the session's CUDA device, -1 for the host."""
    problems = []
    if not d.contiguous:
        problems.append("not contiguous (refit reads and writes the bytes in "
                        "row-major order: pass .contiguous() storage of your own)")
    if not _dtype_ok(d.dtype, expected_dtype):
        problems.append("dtype: expected %s, got %s" % (expected_dtype, d.dtype))
    if len(d.shape) > 3:
        problems.append("shape: %d dimensions, refit's tensors have at most 3"
                        % len(d.shape))
    if d.device != session_device:
        problems.append("device: expected %s (where this %s rank's session runs), "
                        "got %s" % (where_text(session_device), side,
                                    where_text(d.device)))
    if side == "generator" and not d.writable:
        problems.append("read-only (refit writes runtime tensors in place)")
    if problems:
        raise error("INVALID_ARGUMENT", "register %s: %s rank: %s; got %s" % (
            name, side, "; ".join(problems), d.text))


def refit_dtype(d, expected_dtype):
    """The refit dtype code of a described tensor: uint8 stands for the
    float8 type expected, or for itself (NVFP4's packed weight)."""
    codes = {v: k for k, v in _lib.DTYPES.items()}
    if d.dtype in ("bfloat16", "bfloat16(uint16)"):
        return codes["bfloat16"]
    if d.dtype == "uint8":
        return codes[expected_dtype if expected_dtype in _BYTE_TYPES + ("uint8",)
                     else "float8_e4m3fn"]
    return codes.get(d.dtype, codes["bfloat16"])


def view(ptr, nbytes, shape, dtype, device, framework, keep=None):
    """A zero-copy view of refit's memory: numpy (host memory only) or torch.
    bfloat16 is uint16 bits in numpy, torch.bfloat16 in torch; the float8
    types are uint8 (torch's float8 type where it exists). The view holds
    `keep` (the session's storage) for as long as it lives."""
    torch = None
    if framework == "torch":  # asked for: import it if the program did not
        try:
            import torch
        except ImportError:
            pass
    if device < 0:
        raw = (ctypes.c_uint8 * nbytes).from_address(ptr)
        raw._refit_keep = keep  # numpy and torch views hold raw as their base
        arr = np.frombuffer(raw, dtype=np.uint8)
        if framework == "numpy":
            npt = {"bfloat16": np.uint16, "float32": np.float32}.get(dtype, np.uint8)
            return arr.view(npt).reshape(shape)
        if torch is None:
            raise ImportError("refit: torch views need torch")
        # torch has no uint16: bfloat16 goes through int16 bits.
        if dtype == "bfloat16":
            return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16).reshape(shape)
        t = torch.from_numpy(arr)
        ft = getattr(torch, dtype, None)
        return (t.view(ft) if ft is not None else t).reshape(shape)
    if framework == "numpy":
        raise TypeError("refit: a numpy view of device memory (cuda:%d) is not "
                        "possible; use framework='torch'" % device)
    if torch is None:
        raise ImportError("refit: views of device memory need torch")

    class _Cuda:  # __cuda_array_interface__ v3: torch.as_tensor wraps it
        __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                    "data": (ptr, False), "version": 3,
                                    "strides": None}
        _refit_keep = keep  # torch holds the object for the tensor's life

    with torch.cuda.device(device):
        t = torch.as_tensor(_Cuda(), device="cuda:%d" % device)
    if dtype == "bfloat16":
        return t.view(torch.bfloat16).reshape(shape)
    ft = getattr(torch, dtype, None)
    return (t.view(ft) if ft is not None else t).reshape(shape)

"""The C library: where librefit.so is found, and every prototype of
runtime/include/refit/refit.h and status.h the package calls.

This is the one file that restates C declarations (ctypes cannot read a
header): the three structs, the enum values of refit_side_t and
refit_tensor_dtype_t, and the argument types. tests/python/test_binding.py
compares the struct fields with the header so that a change there fails a
test instead of corrupting memory.

ctypes.CDLL releases the GIL for the duration of every foreign call, so
refit's waits (open, begin, progress, commit, join) never block other Python
threads. Nothing here may use ctypes.PyDLL.
"""

import ctypes
import os
import pathlib

_ROOT = pathlib.Path(__file__).resolve().parents[2]


def _candidates():
    env = os.environ.get("REFIT_LIBRARY")
    if env:
        return [pathlib.Path(env)]
    builds = [os.environ.get("REFIT_BUILD_DIR"), _ROOT / "build"]
    return [pathlib.Path(b) / "runtime" / "librefit.so" for b in builds if b]


def _load():
    tried = []
    for path in _candidates():
        tried.append(str(path))
        if path.is_file():
            return ctypes.CDLL(str(path)), str(path)
    raise ImportError(
        "refit: librefit.so not found (tried %s); build it with "
        "`cmake --build build` or set REFIT_LIBRARY=/path/to/librefit.so"
        % ", ".join(tried))


lib, path = _load()

# Importing mpi4py initializes MPI (MPI_THREAD_MULTIPLE by default, which
# refit_comm_join needs): the library and Python share that one MPI. After
# the lookup, so that a missing library is reported without starting MPI.
from mpi4py import MPI  # noqa: E402

# MPI_Comm is a pointer in Open MPI and an int in MPICH.
Comm = ctypes.c_void_p if MPI._sizeof(MPI.Comm) == ctypes.sizeof(ctypes.c_void_p) \
    else ctypes.c_int

# refit_side_t
SIDE_TRAINER, SIDE_GENERATOR = 0, 1
SIDES = {SIDE_TRAINER: "trainer", SIDE_GENERATOR: "generator"}

# refit_state_t (REFIT_STATE_MAP's rows, in order)
STATES = ("idle", "receiving", "ready", "committing", "poisoned")

# refit_tensor_dtype_t
DTYPES = {0: "bfloat16", 1: "float8_e4m3fn", 2: "float8_e8m0fnu", 3: "float32"}


class Tensor(ctypes.Structure):
    """refit_tensor_t"""
    _fields_ = [("name", ctypes.c_char_p), ("data", ctypes.c_void_p),
                ("bytes", ctypes.c_size_t), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * 3), ("dtype", ctypes.c_int)]


class Times(ctypes.Structure):
    """refit_times_t"""
    _fields_ = [(n, ctypes.c_double)
                for n in ("source", "pack", "transfer", "land", "commit", "total")]


class WireStats(ctypes.Structure):
    """refit_wire_stats_t"""
    _fields_ = [("delta", ctypes.c_int), ("wire_bytes", ctypes.c_uint64),
                ("full_bytes", ctypes.c_uint64), ("framed_msgs", ctypes.c_int64),
                ("changed_bytes", ctypes.c_uint64), ("written_bytes", ctypes.c_uint64),
                ("in_place", ctypes.c_int)]


_session = ctypes.c_void_p
_status = ctypes.c_int


def _proto(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


# status.h
status_str = _proto("refit_status_str", ctypes.c_char_p, ctypes.c_int)
status_name = _proto("refit_status_name", ctypes.c_char_p, ctypes.c_int)
last_error = _proto("refit_last_error", ctypes.c_char_p)

# refit.h
session_open = _proto("refit_session_open", _status, Comm, ctypes.c_char_p,
                      ctypes.POINTER(_session))
session_close = _proto("refit_session_close", None, _session)
session_side = _proto("refit_session_side", ctypes.c_int, _session)
session_device = _proto("refit_session_device", ctypes.c_int, _session)
tensor_count = _proto("refit_tensor_count", ctypes.c_int64, _session)
tensor_get = _proto("refit_tensor_get", _status, _session, ctypes.c_int64,
                    ctypes.POINTER(Tensor))
tensor_find = _proto("refit_tensor_find", _status, _session, ctypes.c_char_p,
                     ctypes.POINTER(Tensor))
tensor_skipped = _proto("refit_tensor_skipped", ctypes.c_char_p, _session, ctypes.c_char_p)
tensor_register = _proto("refit_tensor_register", _status, _session,
                         ctypes.POINTER(Tensor))
progress = _proto("refit_progress", _status, _session, ctypes.POINTER(ctypes.c_int))
abort = _proto("refit_abort", _status, _session)
state = _proto("refit_state", ctypes.c_int, _session)
state_str = _proto("refit_state_str", ctypes.c_char_p, ctypes.c_int)
committed_version = _proto("refit_committed_version", ctypes.c_uint64, _session)
last_times = _proto("refit_last_times", _status, _session, ctypes.POINTER(Times))
last_wire_stats = _proto("refit_last_wire_stats", _status, _session,
                         ctypes.POINTER(WireStats))
session_describe = _proto("refit_session_describe", None, _session,
                          ctypes.c_char_p, ctypes.c_size_t)
verify = _proto("refit_verify", _status, _session, ctypes.c_uint64,
                ctypes.POINTER(ctypes.c_int64))
comm_join = _proto("refit_comm_join", _status, Comm, ctypes.c_int, ctypes.c_char_p,
                   ctypes.c_double, ctypes.c_void_p)

config_open = _proto("refit_config_open", _status, ctypes.c_char_p,
                     ctypes.POINTER(ctypes.c_void_p))
config_close = _proto("refit_config_close", None, ctypes.c_void_p)

# refit_begin and refit_commit take the caller's CUDA stream as void *
# (NULL: the legacy default stream; ignored for host memory).
begin = _proto("refit_begin", _status, _session, ctypes.c_uint64, ctypes.c_void_p)
commit = _proto("refit_commit", _status, _session, ctypes.c_void_p)

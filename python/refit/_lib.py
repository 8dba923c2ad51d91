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

_HERE = pathlib.Path(__file__).resolve().parent
_ROOT = _HERE.parents[1]
# The file name the dynamic loader looks up (`cmake --install` puts it in
# the prefix's lib/, /usr/local/lib by default; ldconfig then finds it).
_SONAME = "librefit.so"


def _candidates():
    """Where librefit.so is looked for, in order: REFIT_LIBRARY (an
    override, alone when set); the copy a wheel carries (refit/_native/, when
    it was built with `--config-settings build-dir=BUILD`); for a package
    imported from a checkout (python/ on the path), the checkout's build
    (REFIT_BUILD_DIR, else build/); then the dynamic loader's search path."""
    env = os.environ.get("REFIT_LIBRARY")
    if env:
        return [pathlib.Path(env)]
    found = [_HERE / "_native" / _SONAME]
    if (_ROOT / "pyproject.toml").is_file() and _HERE == _ROOT / "python" / "refit":
        builds = [os.environ.get("REFIT_BUILD_DIR"), _ROOT / "build"]
        found += [pathlib.Path(b) / "runtime" / _SONAME for b in builds if b]
    return found + [_SONAME]


def _load():
    tried = []
    for path in _candidates():
        if isinstance(path, str):  # a bare name: the dynamic loader's search
            tried.append("%s on the loader's path" % path)
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            return lib, _loaded_file(lib, path)
        tried.append(str(path))
        if path.is_file():
            return ctypes.CDLL(str(path)), str(path)
    raise ImportError(
        "refit: librefit.so not found (tried %s); install the package with the "
        "library inside it (`pip install --config-settings build-dir=build .` after "
        "`cmake --build build`), install the library (`cmake --install build`, then "
        "ldconfig), or set REFIT_LIBRARY=/path/to/librefit.so" % ", ".join(tried))


def _loaded_file(lib, name):
    """The file a bare-name CDLL loaded (dladdr of one of its functions)."""
    class DlInfo(ctypes.Structure):
        _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                    ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
    info = DlInfo()
    dladdr = ctypes.CDLL(None).dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    addr = ctypes.cast(lib.refit_status_str, ctypes.c_void_p)
    if dladdr(addr, ctypes.byref(info)) and info.fname:
        return os.fsdecode(info.fname)
    return name


lib, path = _load()


def _mpi_library():
    """(version text, file) of the MPI library librefit calls."""
    f = lib.refit_mpi_library
    f.restype = None
    f.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    version, where = ctypes.create_string_buffer(8192), ctypes.create_string_buffer(4096)
    f(version, len(version), where, len(where))
    return version.value.decode(errors="replace"), where.value.decode(errors="replace")


def check_mpi_library(ours, theirs, mpi4py_module):
    """Raise ImportError when mpi4py's MPI (`theirs`, the text of
    MPI.Get_library_version) is not librefit's (`ours`: (text, file)): two
    MPI libraries in one process do not share a communicator, and an
    MPI_Comm of one passed to the other crashes or hangs."""
    def text(s):
        return s.replace("\x00", "").strip()
    if text(ours[0]) == text(theirs):
        return
    try:
        mpicc = mpi4py_module.get_config().get("mpicc", "?")
    except Exception:  # noqa: BLE001 - only for the message
        mpicc = "?"
    raise ImportError(
        "refit: mpi4py and librefit.so use different MPI libraries; they must use one.\n"
        "  mpi4py (%s, built with mpicc %s): %s\n"
        "  librefit.so (%s, MPI from %s): %s\n"
        "  MPI libraries mapped in this process: %s\n"
        "Install an mpi4py built against librefit's MPI (Debian: apt install "
        "python3-mpi4py, in a venv made with --system-site-packages; or "
        "`pip install --no-binary mpi4py mpi4py` with that MPI's mpicc on PATH), or "
        "build librefit against mpi4py's (CMake's MPI_C_COMPILER)."
        % (os.path.dirname(mpi4py_module.__file__), mpicc, text(theirs), path,
           ours[1] or "?", text(ours[0]), ", ".join(_mapped_mpi()) or "?"))


def _mapped_mpi():
    """The libmpi files this process maps (two when the MPIs differ)."""
    try:
        with open("/proc/self/maps") as f:
            files = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    except OSError:
        return []
    return sorted(p for p in files if os.path.basename(p).startswith("libmpi") and ".so" in p)


mpi_library = _mpi_library()

# Importing mpi4py initializes MPI (MPI_THREAD_MULTIPLE by default, which
# refit_comm_join needs): the library and Python share that one MPI. After
# the lookup, so that a missing library is reported without starting MPI.
import mpi4py  # noqa: E402
from mpi4py import MPI  # noqa: E402

check_mpi_library(mpi_library, MPI.Get_library_version(), mpi4py)

# MPI_Comm is a pointer in Open MPI and an int in MPICH.
Comm = ctypes.c_void_p if MPI._sizeof(MPI.Comm) == ctypes.sizeof(ctypes.c_void_p) \
    else ctypes.c_int

# refit_side_t
SIDE_TRAINER, SIDE_GENERATOR = 0, 1
SIDES = {SIDE_TRAINER: "trainer", SIDE_GENERATOR: "generator"}

# refit_state_t (REFIT_STATE_MAP's rows, in order)
STATES = ("idle", "receiving", "ready", "committing", "poisoned")

# refit_tensor_dtype_t
DTYPES = {0: "bfloat16", 1: "float8_e4m3fn", 2: "float8_e8m0fnu", 3: "float32", 4: "uint8"}


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

"""refit's exception classes, one per refit_status_t, in pure Python.

The agent client (refit.attach) raises them from the status name an agent
sends; the MPI binding (refit.errors) from the code librefit returns. Both
get the same class objects from error_class(), so `except refit.PeerError`
catches either. The names are those of runtime/include/refit/status.h's
REFIT_STATUS_MAP; tests/python/test_binding.py fails when NAMES and the
library's refit_status_name disagree.

A class whose name is a Python builtin exception's (REFIT_ERR_TIMEOUT is
refit.TimeoutError, REFIT_ERR_SYSTEM refit.SystemError) subclasses that
builtin too, as PyTorch's errors do: `except TimeoutError` catches a refit
deadline.
"""

import builtins

# REFIT_STATUS_MAP's error rows, in numeric order from 1.
NAMES = ("INVALID_ARGUMENT", "CONFIG", "NOT_AVAILABLE", "NO_MEMORY", "SYSTEM", "MPI", "CUDA",
         "NCCL", "UCX", "HDF5", "TIMEOUT", "PEER", "MISMATCH", "INTEGRITY", "STATE",
         "INTERNAL")


class Error(Exception):
    """A refit call failed. `status` is the refit_status_t code, `status_name`
    its C name, `message` the sentence naming the phase, rank, tensor,
    expected and actual values."""

    def __init__(self, status, message):
        name = status if isinstance(status, str) else c_name(status)
        self.status = status
        self.status_name = name
        self.message = message
        super().__init__("%s: %s" % (name, message))
        self.args = ("%s: %s" % (name, message),)  # OSError's __init__ leaves them

    def __str__(self):
        # Not OSError's "[Errno n] ..." where a subclass is also one.
        return self.args[0] if self.args else ""


def c_name(code):
    """REFIT_ERR_... of a refit_status_t code."""
    if 1 <= code <= len(NAMES):
        return "REFIT_ERR_" + NAMES[code - 1]
    return "REFIT_ERR_INTERNAL"


def class_name(c_name_):
    """REFIT_ERR_PEER -> PeerError."""
    words = c_name_[len("REFIT_ERR_"):].split("_")
    return "".join(w.capitalize() for w in words) + "Error"


_CLASSES = {}  # REFIT_ERR_... -> class


def error_class(c_name_, doc=None):
    """The class of a status (its C name): refit.Error and, where its name is
    a builtin exception's, that builtin."""
    cls = _CLASSES.get(c_name_)
    if cls is not None and doc:
        cls.__doc__ = doc
    if cls is None:
        name = class_name(c_name_)
        twin = getattr(builtins, name, None)
        bases = (Error, twin) if isinstance(twin, type) and issubclass(twin, Exception) \
            else (Error,)
        body = {"__doc__": doc or c_name_, "__module__": "refit",
                "__init__": Error.__init__, "__str__": Error.__str__}
        if issubclass(bases[-1], OSError):
            # OSError.__new__ would read (status, message) as (errno, strerror).
            body["__new__"] = lambda c, *a, **k: OSError.__new__(c)
        cls = type(name, bases, body)
        _CLASSES[c_name_] = cls
    return cls


def by_class_name(name):
    """The class named `name` (TimeoutError), or None: refit.<Name>Error
    without loading librefit."""
    for n in NAMES:
        if class_name("REFIT_ERR_" + n) == name:
            return error_class("REFIT_ERR_" + n)
    return None

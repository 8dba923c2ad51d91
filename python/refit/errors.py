"""refit.Error and one subclass per refit_status_t, made from the C library's
own list (refit_status_name), so that status.h stays the one place the codes
are written: REFIT_ERR_TIMEOUT becomes refit.TimeoutError, REFIT_ERR_CONFIG
refit.ConfigError, and so on (see refit.errors.BY_STATUS).
"""

from . import _lib


class Error(Exception):
    """A refit call failed. `status` is the refit_status_t code, `status_name`
    its C name, `message` the sentence refit_last_error() gave (naming the
    phase, rank, tensor, expected and actual values)."""

    def __init__(self, status, message):
        self.status = status
        self.status_name = _lib.status_name(status).decode()
        self.message = message
        super().__init__("%s: %s" % (self.status_name, message))

    def __str__(self):
        # Not OSError's "[Errno n] ..." where a subclass is also one
        # (file_not_found below).
        return self.args[0] if self.args else ""


def _class_name(c_name):
    words = c_name[len("REFIT_ERR_"):].split("_")
    return "".join(w.capitalize() for w in words) + "Error"


BY_STATUS = {}  # refit_status_t -> class
CODE = {}  # "INVALID_ARGUMENT" -> refit_status_t
for _code in range(1, 1 << 10):
    _c_name = _lib.status_name(_code).decode()
    if not _c_name.startswith("REFIT_ERR_"):
        break
    _cls = type(_class_name(_c_name), (Error,), {
        "__doc__": "%s: %s" % (_c_name, _lib.status_str(_code).decode()),
        "__module__": "refit"})
    BY_STATUS[_code] = _cls
    CODE[_c_name[len("REFIT_ERR_"):]] = _code
    globals()[_cls.__name__] = _cls
del _code, _c_name, _cls
__all__ = ["Error"] + [c.__name__ for c in BY_STATUS.values()]


def error(status, message):
    """The exception for `status` (a refit_status_t, or its name without
    REFIT_ERR_: "STATE") with `message`."""
    if isinstance(status, str):
        status = CODE[status]
    return BY_STATUS.get(status, Error)(status, message)


_NOT_FOUND = {}  # refit error class -> its FileNotFoundError twin


def file_not_found(err, path):
    """`err` (a refit.Error) as an exception that is also a FileNotFoundError
    for `path`: `except FileNotFoundError` catches a missing config or
    checkpoint as it catches open()'s, `except refit.Error` still does."""
    import errno
    cls = type(err)
    if cls not in _NOT_FOUND:
        _NOT_FOUND[cls] = type(cls.__name__, (cls, FileNotFoundError), {
            "__doc__": cls.__doc__, "__module__": "refit",
            "__new__": lambda c, *a: OSError.__new__(c)})
    out = _NOT_FOUND[cls](err.status, err.message)
    out.errno, out.strerror, out.filename = errno.ENOENT, "No such file or directory", path
    for k, v in vars(err).items():
        setattr(out, k, v)
    out.args = err.args
    return out


def check(status):
    """Raise the exception for a failed C call, with refit_last_error(). Call
    it right after the call, on the same thread: the message is
    thread-local."""
    if status != 0:
        raise error(status, _lib.last_error().decode(errors="replace"))

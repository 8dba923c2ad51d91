"""refit.Error and one subclass per refit_status_t, made from the C library's
own list (refit_status_name): REFIT_ERR_TIMEOUT becomes refit.TimeoutError
(also a builtin TimeoutError), REFIT_ERR_CONFIG refit.ConfigError, and so on
(see refit.errors.BY_STATUS). The classes are refit._status's, the ones the
agent client raises too.
"""

from . import _lib, _status


Error = _status.Error
class_name = _status.class_name

BY_STATUS = {}  # refit_status_t -> class
CODE = {}  # "INVALID_ARGUMENT" -> refit_status_t
for _code in range(1, 1 << 10):
    _c_name = _lib.status_name(_code).decode()
    if not _c_name.startswith("REFIT_ERR_"):
        break
    _cls = _status.error_class(_c_name, "%s: %s" % (_c_name, _lib.status_str(_code).decode()))
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

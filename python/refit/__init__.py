"""refit from Python: a thin ctypes binding over runtime/include/refit/refit.h
(librefit.so). Every decision stays in the C library; this package turns
torch tensors and numpy arrays into refit_tensor_t, C status codes into
exceptions, and refit's memory into zero-copy views.

    import refit
    with refit.Session("job.yaml") as s:          # MPI through mpi4py
        s.register_all(model.named_parameters())  # or the engine's tensors
        for version in range(1, steps + 1):
            train_step()
            times = s.refit(version)              # begin, progress, commit

See docs/python.md.
"""

from . import _lib
from .errors import Error, BY_STATUS, CODE
from .errors import *  # noqa: F401,F403  one class per refit_status_t
from .session import Session, join

__version__ = "0.1.0"
library_path = _lib.path

__all__ = ["Session", "join", "Error", "library_path"] + [
    c.__name__ for c in BY_STATUS.values()]

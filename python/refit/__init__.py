"""refit from Python.

Two ways in:

- refit.attach(side, rank): a framework process (torchrun, vLLM's workers,
  Ray actors) attaches to the refit agent of its rank, launched beside it as
  an MPI job (docs/agent.md). Pure Python: importing refit for this loads
  neither MPI, mpi4py nor librefit.

      import refit
      c = refit.attach("trainer", rank)
      c.register_all(model.named_parameters(), strip_prefix="module.")
      c.refit(version)

- refit.Session(config): the process is itself an MPI rank of the refit
  job, a thin ctypes binding over runtime/include/refit/refit.h
  (librefit.so, mpi4py), loaded on first use of Session or join.

Errors are refit.Error subclasses, one per refit_status_t, from either
path; those named after builtins subclass them too (refit.TimeoutError is a
TimeoutError). Framework plugins (vLLM, NeMo-RL, verl) are in
refit.integrations (docs/integrations.md).

      with refit.Session("job.yaml") as s:          # MPI through mpi4py
          s.register_all(model.named_parameters())  # or the engine's tensors
          for version in range(1, steps + 1):
              train_step()
              times = s.refit(version)              # begin, progress, commit

See docs/python.md and docs/agent.md.
"""

from ._dtype import dtype_name
from .agent import AgentError, Client, attach, empty

__version__ = "0.1.0"


# What the MPI binding adds to the package, loaded on first use. Only these
# names: a tool that probes attributes (pytest's collection asks every module
# global for its markers) must not start MPI in this process.
_BINDING = {"Session": "session", "join": "session",
            "BY_STATUS": "errors", "CODE": "errors", "error": "errors", "check": "errors"}


def __getattr__(name):
    # import_module, not "from . import": that form asks this function for
    # the submodule first.
    import importlib
    if name == "library_path":
        return importlib.import_module(__name__ + "._lib").path
    if name in ("session", "errors", "adapters", "_lib", "_tensors"):
        return importlib.import_module(__name__ + "." + name)
    if name in ("Error", "integrations", "_status"):
        return importlib.import_module(__name__ + "._status").Error if name == "Error" \
            else importlib.import_module(__name__ + "." + name)
    # One class per refit_status_t (TimeoutError, PeerError, ...), pure Python:
    # the agent client raises them without librefit.
    cls = importlib.import_module(__name__ + "._status").by_class_name(name)
    if cls is not None:
        return cls
    sub = _BINDING.get(name)
    if sub is None:
        raise AttributeError("module 'refit' has no attribute %r" % name)
    module = importlib.import_module(__name__ + "." + sub)
    if not hasattr(module, name):
        raise AttributeError("module 'refit' has no attribute %r" % name)
    return getattr(module, name)


def __dir__():
    return sorted(list(globals()) + ["Session", "join", "Error", "library_path"])

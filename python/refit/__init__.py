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
  (librefit.so, mpi4py), loaded on first use of Session, join, Error and the
  error classes.

      with refit.Session("job.yaml") as s:          # MPI through mpi4py
          s.register_all(model.named_parameters())  # or the engine's tensors
          for version in range(1, steps + 1):
              train_step()
              times = s.refit(version)              # begin, progress, commit

See docs/python.md and docs/agent.md.
"""

from .agent import AgentError, Client, attach, empty

__version__ = "0.1.0"


def __getattr__(name):
    # The MPI binding loads librefit and mpi4py: only when asked for.
    # import_module, not "from . import": that form asks this function for
    # the submodule first.
    import importlib
    if name.startswith("__") or name in ("errors", "session", "_lib", "_tensors", "adapters"):
        raise AttributeError("module 'refit' has no attribute %r" % name)
    if name == "library_path":
        return importlib.import_module(__name__ + "._lib").path
    for sub in ("session", "errors"):
        module = importlib.import_module(__name__ + "." + sub)
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError("module 'refit' has no attribute %r" % name)


def __dir__():
    return sorted(list(globals()) + ["Session", "join", "Error", "library_path"])

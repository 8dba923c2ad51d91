"""What the framework plugins share: one attached agent client per process
and side, the tensors the process registers, and the refit lifecycle the
plugins map their frameworks' calls onto.

An RL stack's weight-sync interfaces (vLLM's WeightTransferEngine, NeMo-RL's
and verl's CheckpointEngine) move gathered Hugging Face tensors from a
trainer to an engine. refit instead reads each trainer rank's own shards and
writes the engine's runtime parameters in place, through the agents of the
job (docs/agent.md). So a plugin needs, in each process, the tensors refit
works on:

- a trainer process names its module's parameters once, with
  provide("trainer", model.named_parameters(), strip_prefix="module.");
- an engine process running vLLM with the `refit` weight-transfer backend
  has them provided by the backend after vLLM loaded the model; another
  engine calls provide("generator", named_runtime_tensors).

The streamed tensors the frameworks hand their engines are never read.

The client outlives a framework's per-update prepare/finalize: a process
attaches once (its agent keeps its registration and, on an engine, the
storage's last committed version) and detaches at exit or at shutdown().
"""

import asyncio
import logging
import os
import threading

from .. import _config
from .. import agent as _agent

log = logging.getLogger("refit")

SIDES = ("trainer", "generator")

_lock = threading.RLock()
_provided = {}    # side -> (named tensors or a callable giving them, strip_prefix)
_asleep = {}      # side -> callable: a sentence when the provided memory is unusable now
_endpoints = {}   # side -> Endpoint


def framework_base(module, name, framework, install):
    """The framework's class `name` from `module`, or a stand-in that lets
    this module import without the framework and fails with a sentence
    naming what is missing when a plugin object is made."""
    import importlib
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as e:
        why = str(e)

    class Missing:
        def __init__(self, *args, **kwargs):
            raise ImportError("refit's %s plugin needs %s (%s.%s could not be imported: %s); "
                              "%s" % (framework, framework, module, name, why, install))

    Missing.__name__ = name
    Missing.__qualname__ = name
    Missing.missing = True
    return Missing


def options(config, what):
    """A plugin's options (socket_dir, timeout_s, next_timeout_s) from a path,
    dict or mapping."""
    opts = {k: v for k, v in _config.load(config, what).items() if v is not None}
    unknown = sorted(set(opts) - {"socket_dir", "timeout_s", "next_timeout_s"})
    if unknown:
        raise TypeError("%s: unknown refit options %s (socket_dir, timeout_s, next_timeout_s)"
                        % (what, unknown))
    return opts


def provide(side, tensors, strip_prefix=None, asleep=None):
    """Name what this process registers with its agent for `side`
    ('trainer' or 'generator'): (name, tensor) pairs or a dict (e.g.
    model.named_parameters()), or a callable that gives them once the
    agent's expected() list is known (it is called with that list).
    `strip_prefix` removes a wrapper's prefix (module.) from each name.
    `asleep`: a callable returning a sentence while the memory is not usable
    (an engine put to sleep), or None; a refit arriving then is refused by
    name. Call it before the plugin attaches (its first process-group or
    init call); a later call applies at the next attach."""
    if side not in SIDES:
        raise ValueError("refit.integrations.provide: side is 'trainer' or 'generator', not %r"
                         % (side,))
    if not callable(tensors) and not hasattr(tensors, "items"):
        tensors = list(tensors)  # a generator such as named_parameters(): keep its pairs
    with _lock:
        _provided[side] = (tensors, strip_prefix)
        _asleep[side] = asleep


def endpoint(side, rank, opts, what):
    """This process's Endpoint for `side`, attached to the agent of `rank`
    (the one already attached if there is one: a framework that rebuilds its
    engine per update keeps its registration)."""
    with _lock:
        e = _endpoints.get(side)
        if e is not None and e.client is not None:
            if e.rank != rank:
                raise ValueError("%s: this process is attached as %s rank %d; asked for rank %d"
                                 % (what, side, e.rank, rank))
            return e
        e = Endpoint(side, rank, opts, what)
        _endpoints[side] = e
        return e


def detach_all():
    """Detach every endpoint of this process (tests; plugin shutdown)."""
    with _lock:
        for e in _endpoints.values():
            e.close()
        _endpoints.clear()


class Endpoint:
    """One side of this process attached to its agent, with the versions
    it refits. Trainers number versions themselves (every trainer rank runs
    the same sequence of refits, so each computes the same number); engines
    take the version the trainers began."""

    def __init__(self, side, rank, opts, what):
        self.side, self.rank, self.what = side, int(rank), what
        self.opts = dict(opts or {})
        self.client = _agent.attach(side, self.rank, socket_dir=self.opts.get("socket_dir"),
                                    timeout_s=float(self.opts.get("timeout_s", 60.0)))
        self.tried = self.client.committed_version  # the last version this side began
        self.version = None                         # the engine's refit in progress
        self._pending = None                        # a refusal's vote, on a thread
        self._register()

    def _register(self):
        with _lock:
            got = _provided.get(self.side)
            self.asleep = _asleep.get(self.side)
        if got is None:
            self.close()
            if self.side == "trainer":
                hint = ("call refit.integrations.provide('trainer', model.named_parameters(), "
                        "strip_prefix='module.') in the trainer process first: refit reads "
                        "the trainer's own shards")
            else:
                hint = ("start vLLM with the refit weight-transfer backend (it provides the "
                        "model's runtime parameters after load), or call "
                        "refit.integrations.provide('generator', named_tensors) first")
            raise RuntimeError("%s: no %s tensors to register; %s" % (self.what, self.side, hint))
        tensors, strip_prefix = got
        if callable(tensors):
            tensors = tensors(self.client.expected())
        self.client.register_all(tensors, strip_prefix=strip_prefix)
        log.info("refit: %s rank %d attached (pid %d) and registered its tensors",
                 self.side, self.rank, os.getpid())

    def close(self):
        pending, self._pending = getattr(self, "_pending", None), None
        if pending is not None:
            pending.join()
        if self.client is not None:
            self.client.close()
            self.client = None

    def _live(self):
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.join()
        if self.client is None:
            raise _agent.AgentError("REFIT_ERR_STATE", "%s: %s rank %d is detached (shut down)"
                                    % (self.what, self.side, self.rank))
        return self.client

    # -- trainers ----------------------------------------------------------------
    def trainer_refit(self):
        """Refit the next version from the registered shards (blocking)."""
        c = self._live()
        self.tried += 1
        c.refit(self.tried)
        return c.metrics()

    async def trainer_refit_async(self, streamed=None):
        """trainer_refit on a thread, for frameworks that await send_weights.
        `streamed`, the framework's generator of gathered tensors, is closed
        unread: refit reads the trainer's own shards in place."""
        close = getattr(streamed, "close", None)
        if close is not None:
            close()
        return await asyncio.get_running_loop().run_in_executor(None, self.trainer_refit)

    # -- engines -----------------------------------------------------------------
    def engine_begin(self):
        """Wait for the version the trainers began and begin it. Refused by
        name, after this rank voted no so that the round fails at once
        everywhere, while the provided memory is asleep."""
        c = self._live()
        v = c.next_version(self.opts.get("next_timeout_s"))
        if v is None:
            raise _agent.AgentError("REFIT_ERR_TIMEOUT",
                                    "%s: generator rank %d: no refit began within %s s"
                                    % (self.what, self.rank, self.opts.get("next_timeout_s")))
        why = self.asleep() if self.asleep is not None else None
        c.begin(v)
        self.version = v
        if why:
            # The no vote waits for every rank to reach the vote; a framework
            # whose control plane waits for this call to return before it
            # lets the other engines vote (vLLM's start_weight_update) would
            # wait on it. So the vote is cast on a thread, which the next
            # call on this endpoint joins.
            self._pending = threading.Thread(target=self.abort, name="refit-refuse",
                                             daemon=True)
            self._pending.start()
            raise _agent.AgentError(
                "REFIT_ERR_STATE", "%s: generator rank %d refused the refit of version %d: %s"
                % (self.what, self.rank, v, why))
        return v

    def engine_progress(self):
        """Land every bucket of the refit begun (votes no on a failure)."""
        c = self._live()
        try:
            while not c.progress():
                pass
        except BaseException:
            self.abort()
            raise

    def engine_commit(self):
        c = self._live()
        try:
            c.commit()
        finally:
            self.version = None
        return c.metrics()

    def engine_refit(self):
        """begin, progress, commit: one whole refit of the next version."""
        self.engine_begin()
        self.engine_progress()
        return self.engine_commit()

    async def engine_refit_async(self):
        return await asyncio.get_running_loop().run_in_executor(None, self.engine_refit)

    def abort(self):
        """Vote no on the refit begun, if one is (idempotent)."""
        if self.version is not None and self.client is not None:
            self.version = None
            try:
                self.client.abort()
            except _agent.AgentError as e:
                log.warning("refit: %s rank %d: abort: %s", self.side, self.rank, e)

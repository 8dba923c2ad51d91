"""Method-name adapters over the in-process refit.Session.

The framework plugins, with the frameworks' real interfaces and call
orders, are in refit.integrations (docs/integrations.md); these two are
for stacks that run their ranks in refit's MPI job.

Two thin adapters over refit.Session, with the method names of the
interfaces they stand in for, so that a stack swaps its weight-sync backend
and keeps its call sites:

- WeightSynchronizer: NeMo-RL's weight synchronizer shape
  (init_communicator, sync_weights returning metrics, shutdown).
- CheckpointEngine: verl's checkpoint-engine shape (prepare,
  build_topology, send_weights on trainers / receive_weights on engines,
  finalize).

Neither knows anything of refit's rules: each call is one or two Session
calls. The trainer hands over its module (Megatron-Core names under the
wrapper's prefix), the engine its runtime parameters under vLLM's names;
refit reads and writes them in place.
"""

from .session import Session


def _metrics(times, version, prefix):
    out = {"%s/%s_s" % (prefix, k): v for k, v in times.items()}
    out["%s/version" % prefix] = version
    return out


class WeightSynchronizer:
    """NeMo-RL's shape: init_communicator() once, sync_weights() after each
    training step (both sides, collectively), shutdown() at the end.

    tensors: the side's named tensors, e.g. model.named_parameters() on a
    trainer or the engine's {vLLM name: tensor}; strip_prefix removes a
    wrapper's prefix ("module.") from the trainer's names. An engine may pass
    a callable instead: given session.expected(), it returns the tensors
    (an engine that allocates what refit lists)."""

    def __init__(self, config_path, tensors, strip_prefix=None, comm=None):
        self.config_path, self.tensors = config_path, tensors
        self.strip_prefix, self.comm = strip_prefix, comm
        self.session = None
        self.version = 0

    def init_communicator(self):
        """Open the session (collective) and register this side's tensors."""
        self.session = Session(self.config_path, comm=self.comm)
        if callable(self.tensors):
            self.tensors = self.tensors(self.session.expected())
        self.session.register_all(self.tensors, strip_prefix=self.strip_prefix)
        return self.session.side

    def sync_weights(self, version=None):
        """Refit the next version (collective); returns a dict of metrics a
        framework can log: seconds per phase and the version."""
        self.version = self.version + 1 if version is None else version
        times = self.session.refit(self.version)
        return _metrics(times, self.version, "refit")

    def shutdown(self):
        if self.session is not None:
            self.session.close()
            self.session = None


class CheckpointEngine:
    """verl's shape: prepare() and build_topology() once, then per step
    send_weights(named_tensors) on trainers and receive_weights() on
    engines (a collective pair), finalize() at the end."""

    def __init__(self, config_path, comm=None, strip_prefix=None):
        self.config_path, self.comm, self.strip_prefix = config_path, comm, strip_prefix
        self.session = None
        self.version = 0

    def prepare(self):
        """Open the session (collective)."""
        self.session = Session(self.config_path, comm=self.comm)

    def build_topology(self):
        """Which side this rank is, and what it must hand over."""
        return {"side": self.session.side, "expected": self.session.expected()}

    def _register(self, named_tensors):
        # Every call, into whatever session is open now (a prepare() after
        # finalize() opens a new one): tensors registered as they are cost a
        # comparison; a trainer's that moved are registered again.
        self.session.register_all(named_tensors, strip_prefix=self.strip_prefix)

    def send_weights(self, named_tensors):
        """Trainer: refit the weights these tensors hold now (registered in
        this session on the first call, again where they moved)."""
        self._register(named_tensors)
        self.version += 1
        return _metrics(self.session.refit(self.version), self.version, "refit")

    def receive_weights(self, named_tensors=None):
        """Engine: receive the next version into its runtime tensors (or,
        given none, into the session's own storage: session.tensors())."""
        if named_tensors is not None:
            self._register(named_tensors)
        self.version += 1
        return _metrics(self.session.refit(self.version), self.version, "refit")

    def finalize(self):
        if self.session is not None:
            self.session.close()
            self.session = None

"""refit as verl's checkpoint engine `refit`.

Follows verl/checkpoint_engine/base.py (CheckpointEngine: prepare, the
classmethod build_topology, init_process_group, async send_weights, async
receive_weights, finalize; CheckpointEngineRegistry.register) as verl calls
it: CheckpointEngineManager.update_weights runs, for every update, prepare()
on every trainer and rollout worker, build_topology(trainer_world_size,
rollout_world_size, metadata), init_process_group(**kwargs) with each
worker's share of the topology, then the trainer's `await
send_weights(per_tensor_param)` (verl/workers/engine_workers.py
update_weights) beside the rollout's `weights = receive_weights()` handed to
the server adapter, which iterates it with `async for`
(CheckpointEngineWorker.update_weights), and finalize() on every worker.
Trainers make the engine with is_master= and bucket_size=, rollouts with
bucket_size=, both with the config's engine_kwargs['refit'].

Importing this module registers the engine (verl imports it in every
process with VERL_USE_EXTERNAL_MODULES=refit.integrations.verl, or with
actor_rollout_ref.model.external_lib). send_weights refits the next version
from the trainer's own shards (refit.integrations.provide) and closes verl's
generator of gathered Hugging Face tensors unread; receive_weights refits
the engine's runtime parameters in place and yields no tensor. The agent
client survives verl's per-update prepare/finalize: the process attaches
at its first init_process_group and stays attached.
"""

import os

from . import _core

_INSTALL = "install verl"

CheckpointEngine = _core.framework_base("verl.checkpoint_engine.base", "CheckpointEngine",
                                        "verl", _INSTALL)


class RefitCheckpointEngine(CheckpointEngine):
    """verl's checkpoint engine over refit agents. engine_kwargs: socket_dir,
    timeout_s, next_timeout_s. `bucket_size` is verl's (unused: refit's
    buckets are its config's refit.bucket_bytes)."""

    def __init__(self, bucket_size=None, is_master=False, socket_dir=None, timeout_s=None,
                 next_timeout_s=None):
        super().__init__()
        self._opts = _core.options({"socket_dir": socket_dir, "timeout_s": timeout_s,
                                    "next_timeout_s": next_timeout_s}, type(self).__name__)
        self._endpoint = None

    def prepare(self):
        """Nothing to allocate: refit's buffers live in the agents."""
        return {"backend": "refit", "pid": os.getpid()}

    @classmethod
    def build_topology(cls, trainer_world_size, rollout_world_size, metadata):
        """Each trainer worker is the trainer rank of its index, each rollout
        worker the generator rank of its index (replica by replica, as refit
        numbers engines: engine * tp + tp_rank)."""
        trainer = {"side": ["trainer"] * trainer_world_size,
                   "rank": list(range(trainer_world_size))}
        rollout = {"side": ["generator"] * rollout_world_size,
                   "rank": list(range(rollout_world_size))}
        return trainer, rollout

    def init_process_group(self, side, rank):
        self._endpoint = _core.endpoint(side, rank, self._opts, "refit verl checkpoint engine")

    def _live(self, side):
        if self._endpoint is None or self._endpoint.side != side:
            raise RuntimeError("refit verl checkpoint engine: init_process_group(side=%r) was "
                               "not called in this update" % side)
        return self._endpoint

    async def send_weights(self, weights):
        """Refit the next version from this trainer's shards. verl's
        generator of gathered tensors is closed unread."""
        self.last_metrics = await self._live("trainer").trainer_refit_async(weights)

    async def receive_weights(self):
        """Refit this rollout worker's runtime parameters in place; yields
        nothing for the server adapter to load."""
        e = self._live("generator")
        self.last_metrics = await e.engine_refit_async()
        return
        yield  # an async generator that yields nothing

    def finalize(self):
        """Per-update state only: the process stays attached, and the next
        update's init_process_group finds its client."""
        if self._endpoint is not None:
            self._endpoint.abort()
            self._endpoint = None


def _register():
    try:
        from verl.checkpoint_engine.base import CheckpointEngineRegistry
    except ImportError:
        return  # without verl there is nothing to register with
    if "refit" not in getattr(CheckpointEngineRegistry, "_registry", {}):
        CheckpointEngineRegistry.register("refit")(RefitCheckpointEngine)


_register()

"""Stand-in for nemo_rl/utils/checkpoint_engines/base.py: the abstract
CheckpointEngine and create_checkpoint_engine, which loads a
'module:ClassName' backend with bucket_size= and the engine kwargs."""

import abc
import importlib


class CheckpointEngine(abc.ABC):
    shard_expert_weights = False

    def get_target_weight_layout(self):
        return None

    @abc.abstractmethod
    def prepare(self): ...

    @abc.abstractmethod
    def init_policy_process_group(self, *, worker_rank, train_world_size, rollout_world_size,
                                  metadata): ...

    @abc.abstractmethod
    def init_rollout_process_group(self, *, rollout_rank, train_world_size,
                                   rollout_world_size, metadata): ...

    def finalize(self):
        pass

    @abc.abstractmethod
    async def send_weights(self, weights): ...

    @abc.abstractmethod
    def receive_weight_batches(self): ...


def create_checkpoint_engine(backend, *, bucket_size_bytes, engine_kwargs):
    if ":" not in backend:
        raise ValueError("Unknown checkpoint-engine backend %r" % backend)
    module_name, class_name = backend.split(":", 1)
    engine_cls = getattr(importlib.import_module(module_name), class_name)
    return engine_cls(bucket_size=bucket_size_bytes, **engine_kwargs)

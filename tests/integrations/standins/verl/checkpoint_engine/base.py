"""Stand-in for verl/checkpoint_engine/base.py: CheckpointEngineRegistry
(register as a decorator factory, get, new) and the abstract
CheckpointEngine."""

import abc


class CheckpointEngineRegistry:
    _registry = {}

    def register(backend):
        def wrapper(cls):
            CheckpointEngineRegistry._registry[backend] = cls
            return cls
        return wrapper

    @classmethod
    def get(cls, backend):
        return cls._registry[backend]

    @classmethod
    def new(cls, backend, *args, **kwargs):
        if backend not in cls._registry:
            raise ValueError("Checkpoint engine %s not registered" % backend)
        return cls._registry[backend](*args, **kwargs)


class CheckpointEngine(abc.ABC):
    @abc.abstractmethod
    def prepare(self): ...

    @classmethod
    @abc.abstractmethod
    def build_topology(cls, trainer_world_size, rollout_world_size, metadata): ...

    @abc.abstractmethod
    def init_process_group(self, **kwargs): ...

    @abc.abstractmethod
    def finalize(self): ...

    @abc.abstractmethod
    async def send_weights(self, weights): ...

    @abc.abstractmethod
    async def receive_weights(self): ...

"""Stand-in for nemo_rl/weight_sync/interfaces.py: the abstract
WeightSynchronizer."""

import abc


class WeightSynchronizer(abc.ABC):
    @abc.abstractmethod
    def sync_weights(self, *, timer=None, kv_scales=None): ...

    @property
    @abc.abstractmethod
    def is_stale(self): ...

    @abc.abstractmethod
    def init_communicator(self): ...

    @abc.abstractmethod
    def shutdown(self): ...

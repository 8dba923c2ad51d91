"""Stand-in for vllm/distributed/weight_transfer/base.py: the worker engine
and trainer engine base classes and their info classes, with vLLM's
signatures; update_weights parses, receives and synchronizes as vLLM's
does."""

import abc
import dataclasses

import torch


@dataclasses.dataclass
class WeightTransferInitInfo(abc.ABC):
    pass


@dataclasses.dataclass
class TrainerInitInfo(WeightTransferInitInfo):
    rank: int = dataclasses.field(kw_only=True)

    @property
    def is_sender(self):
        return self.rank == 0


@dataclasses.dataclass
class WeightTransferUpdateInfo(abc.ABC):
    pass


class WeightTransferEngine(abc.ABC):
    supports_draft_weight_update = True

    def __init__(self, config, vllm_config, device, model):
        self.config = config
        self.vllm_config = vllm_config
        self.parallel_config = vllm_config.parallel_config
        self.model_config = vllm_config.model_config
        self.device = device
        self.model = model

    def parse_init_info(self, init_dict):
        try:
            return self.init_info_cls(**init_dict)
        except TypeError as e:
            raise ValueError("Invalid init_info for %s: %s" % (type(self).__name__, e)) from e

    def parse_update_info(self, update_dict):
        try:
            return self.update_info_cls(**update_dict)
        except TypeError as e:
            raise ValueError("Invalid update_info for %s: %s" % (type(self).__name__, e)) from e

    @abc.abstractmethod
    def init_transfer_engine(self, init_info): ...

    @abc.abstractmethod
    def start_weight_update(self): ...

    @abc.abstractmethod
    def finish_weight_update(self): ...

    def update_weights(self, update_info):
        self.receive_weights(self.parse_update_info(update_info))
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # vLLM: torch.accelerator.synchronize()

    @abc.abstractmethod
    def receive_weights(self, update_info): ...

    @abc.abstractmethod
    def shutdown(self): ...

    @staticmethod
    @abc.abstractmethod
    def trainer_send_weights(iterator, trainer_args): ...


class WeightSource(abc.ABC):
    @abc.abstractmethod
    def metadata(self): ...

    @abc.abstractmethod
    def __iter__(self): ...


class ModuleSource(WeightSource):
    """Iterating it "gathers" (here: counts how often it was iterated)."""

    def __init__(self, module):
        self._module = module
        self.iterated = 0

    def metadata(self):
        return [(n, p.dtype, tuple(p.shape)) for n, p in self._module.named_parameters()]

    def __iter__(self):
        self.iterated += 1
        for name, p in self._module.named_parameters():
            yield name, p


class TrainerWeightTransferEngine(abc.ABC):
    def __init__(self, config, *, client, source, is_sender=True):
        self.config = config
        self.is_sender = is_sender
        self.client = client
        self.source = source

    @classmethod
    @abc.abstractmethod
    def trainer_init(cls, config, init_info, *, client, source): ...

    @abc.abstractmethod
    def send_weights(self): ...

    def shutdown(self):
        pass

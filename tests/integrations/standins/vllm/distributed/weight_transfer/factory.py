"""Stand-in for vllm/distributed/weight_transfer/factory.py: the two
registries, lazy registration by module path and class name."""

import importlib


def _register(registry, what, name, module_path_or_cls, class_name=None):
    if name in registry:
        raise ValueError("%s '%s' is already registered." % (what, name))
    if isinstance(module_path_or_cls, str):
        if class_name is None:
            raise ValueError("class_name is required when registering with module path")
        registry[name] = lambda: getattr(importlib.import_module(module_path_or_cls),
                                         class_name)
    else:
        registry[name] = lambda: module_path_or_cls


class WeightTransferEngineFactory:
    _registry = {}

    @classmethod
    def register_engine(cls, name, module_path_or_cls, class_name=None):
        _register(cls._registry, "Weight transfer engine", name, module_path_or_cls,
                  class_name)

    @classmethod
    def create_engine(cls, config, vllm_config, device, model):
        if config.backend not in cls._registry:
            raise ValueError("Invalid weight transfer backend: %s. Available engines: %s"
                             % (config.backend, list(cls._registry)))
        return cls._registry[config.backend]()(config, vllm_config, device, model)


class WeightTransferTrainerFactory:
    _registry = {}

    @classmethod
    def register_engine(cls, name, module_path_or_cls, class_name=None):
        _register(cls._registry, "Weight transfer trainer engine", name, module_path_or_cls,
                  class_name)

    @classmethod
    def trainer_init(cls, backend, config, init_info, *, client, source):
        if backend not in cls._registry:
            raise ValueError("Invalid weight transfer backend: %s" % backend)
        return cls._registry[backend]().trainer_init(config=config, init_info=init_info,
                                                     client=client, source=source)

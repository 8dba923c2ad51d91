"""Configs as the Python API takes them: a path, a dict, or a mapping such as
OmegaConf's DictConfig (what Hydra-configured stacks like verl and NeMo-RL
hand their plugins), turned into plain Python or into a file for the C
library."""

import collections.abc
import json
import os
import tempfile


def plain(obj):
    """dicts, lists and scalars from any nesting of mappings and sequences
    (OmegaConf's DictConfig and ListConfig included: both are
    collections.abc containers)."""
    if isinstance(obj, collections.abc.Mapping):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, collections.abc.Sequence) and not isinstance(obj, (str, bytes)):
        return [plain(v) for v in obj]
    return obj


def is_path(obj):
    return isinstance(obj, (str, bytes, os.PathLike))


def load(config, what):
    """A config given as a path (YAML, or JSON) or a mapping, as plain
    Python. `what` names the caller in errors."""
    if config is None:
        return {}
    if not is_path(config):
        if not isinstance(config, collections.abc.Mapping):
            raise TypeError("%s: the config is a path, a dict or a mapping, not a %s"
                            % (what, type(config).__name__))
        return plain(config)
    path = os.fsdecode(config)
    with open(path) as f:
        text = f.read()
    try:
        import yaml
    except ImportError:
        try:
            return json.loads(text)
        except ValueError:
            raise ImportError("%s: reading %s needs PyYAML (pip install pyyaml), or give "
                              "the config as a dict" % (what, path)) from None
    return yaml.safe_load(text) or {}


class AsFile:
    """A path for the C library's config reader: the path given, or a
    private temporary file holding a mapping as JSON (a subset of YAML),
    removed on close()."""

    def __init__(self, config, what):
        self._tmp = None
        if is_path(config):
            self.path = os.fsdecode(config)
            return
        if not isinstance(config, collections.abc.Mapping):
            raise TypeError("%s: the config is a path, a dict or a mapping, not a %s"
                            % (what, type(config).__name__))
        fd, self.path = tempfile.mkstemp(prefix="refit-config.", suffix=".yaml")
        self._tmp = self.path
        with os.fdopen(fd, "w") as f:
            json.dump(plain(config), f, indent=1)

    def close(self):
        if self._tmp is not None:
            os.unlink(self._tmp)
            self._tmp = None

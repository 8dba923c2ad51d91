"""Stand-in for vllm/plugins/__init__.py load_general_plugins: every
`vllm.general_plugins` entry point is loaded and called, in each process."""

from importlib import metadata


def load_general_plugins():
    eps = metadata.entry_points()
    group = eps.select(group="vllm.general_plugins") if hasattr(eps, "select") \
        else eps.get("vllm.general_plugins", [])
    for ep in group:
        ep.load()()

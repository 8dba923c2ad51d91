"""Stand-in for verl/checkpoint_engine."""
from .base import CheckpointEngine, CheckpointEngineRegistry  # noqa: F401

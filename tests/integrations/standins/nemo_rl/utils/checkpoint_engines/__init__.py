"""Stand-in for nemo_rl/utils/checkpoint_engines."""

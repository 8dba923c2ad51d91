"""Stand-in for nemo_rl/weight_sync."""

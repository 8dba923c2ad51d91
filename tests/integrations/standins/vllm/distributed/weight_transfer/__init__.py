"""Stand-in for vllm/distributed/weight_transfer."""

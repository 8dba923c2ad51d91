"""Stand-in for vllm/device_allocator."""

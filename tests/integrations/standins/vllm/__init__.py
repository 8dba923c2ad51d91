"""Stand-in for vLLM (see ../README.md)."""

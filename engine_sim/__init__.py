"""A simulated engine: in-process (``engine.py``) or behind vLLM's HTTP API (``server.py``)."""

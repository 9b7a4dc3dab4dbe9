"""Replaying one trace: wire the production scheduler into the simulator, run, summarize."""

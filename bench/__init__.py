"""Benchmarks behind `pdd-router bench ...` (figures, not tests)."""

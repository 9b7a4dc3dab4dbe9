"""Offline replay of production traces: readers, statistics, synthetic traces, simulation."""

"""Offline A/B experiments: comparisons, rate sweeps, their statistics, and the demo."""

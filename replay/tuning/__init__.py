"""Tuning a policy's thresholds under the SLA by replaying scenarios."""

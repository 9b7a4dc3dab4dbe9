"""Replay metrics: per-request records, the run summary, writers and the summary table."""

from __future__ import annotations

from replay.metrics.record import RequestRecord, record_of
from replay.metrics.summary import (
    Percentiles,
    SlaThresholds,
    Summary,
    TransferStats,
    summarize,
    wan_gbps,
)
from replay.metrics.table import summary_table
from replay.metrics.writers import write_requests, write_run, write_summary

__all__ = [
    "Percentiles",
    "RequestRecord",
    "SlaThresholds",
    "Summary",
    "TransferStats",
    "record_of",
    "summarize",
    "summary_table",
    "wan_gbps",
    "write_requests",
    "write_run",
    "write_summary",
]

"""Trace statistics for people (rich tables) and for programs (JSON)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rich.console import Console, Group
from rich.table import Table

from replay.trace.stats import TraceStats

__all__ = ["print_stats", "stats_json", "stats_tables"]


def stats_json(stats: TraceStats, header: Mapping[str, Any] | None = None) -> str:
    """The statistics as indented JSON, after the ``header`` keys (e.g. trace and format)."""
    return json.dumps({**(header or {}), **stats.model_dump(mode="json")}, indent=2)


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _share(value: float) -> str:
    return f"{100 * value:.1f}%"


def _overview(stats: TraceStats) -> Table:
    table = Table(title="Requests", show_header=False, title_justify="left")
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    rate = stats.arrival_rate_rps
    table.add_row("requests", f"{stats.requests:,}")
    table.add_row("duration", f"{stats.duration_s:,.1f} s")
    table.add_row("arrival rate", "n/a" if rate is None else f"{rate:.2f} req/s")
    if stats.sessions is not None:
        table.add_row("sessions", f"{stats.sessions:,}")
    table.add_row("input tokens", f"{stats.input_tokens:,}")
    table.add_row("output tokens", f"{stats.output_tokens:,}")
    table.add_row("block size", f"{stats.block_size} tokens")
    odd = f"{stats.odd_requests:,} ({_share(stats.odd_share)})"
    table.add_row(
        f"odd (input >= {stats.odd_min_input:,}, output <= {stats.odd_max_output:,})", odd
    )
    return table


def _lengths(stats: TraceStats) -> Table:
    table = Table(title="Lengths (tokens)", title_justify="left")
    table.add_column("")
    for name in ("p50", "p90", "p99", "mean", "max"):
        table.add_column(name, justify="right")
    for label, dist in (("input", stats.input_length), ("output", stats.output_length)):
        table.add_row(
            label,
            f"{dist.p50:,.0f}",
            f"{dist.p90:,.0f}",
            f"{dist.p99:,.0f}",
            f"{dist.mean:,.1f}",
            f"{dist.max:,}",
        )
    return table


def _hits(stats: TraceStats) -> Table:
    table = Table(title="Prefix hit rate (global cache)", title_justify="left")
    table.add_column("cache")
    table.add_column("hit rate (tokens)", justify="right")
    table.add_column("mean per request", justify="right")
    table.add_row("unbounded", _rate(stats.hit_rate_tokens), _rate(stats.hit_rate_mean))
    for size, rate in stats.lru_hit_rate_tokens.items():
        table.add_row(f"LRU {size:,} tokens", _rate(rate), "")
    return table


def _buckets(stats: TraceStats) -> Table:
    table = Table(title="Requests by hit rate", title_justify="left")
    table.add_column("hit rate")
    table.add_column("share", justify="right")
    for label, share in (stats.hit_buckets or {}).items():
        table.add_row(label, _share(share))
    table.add_section()
    for label, share in (stats.hit_buckets_coarse or {}).items():
        table.add_row(label, _share(share))
    if stats.hit_share_above_95 is not None:
        table.add_section()
        table.add_row("95-100%", _share(stats.hit_share_above_95))
    return table


def stats_tables(stats: TraceStats) -> Group:
    """The statistics as a group of rich tables."""
    parts: list[Table] = [_overview(stats), _lengths(stats)]
    if stats.prefix_info:
        parts += [_hits(stats), _buckets(stats)]
    return Group(*parts)


def print_stats(console: Console, stats: TraceStats, title: str | None = None) -> None:
    """Print a title line, the tables, and a note when the trace has no prefix information."""
    if title:
        console.print(title, style="bold", highlight=False)
    console.print(stats_tables(stats))
    if not stats.prefix_info:
        console.print("no prefix information in this trace: hit rates are not available")

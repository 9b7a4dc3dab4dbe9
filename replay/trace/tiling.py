"""Extend a short trace by tiling it: copies one after the other, each with fresh identities.

A capacity measured on a trace that the cluster swallows in a few seconds measures a
burst, not a steady state. ``tile`` repeats the trace until it spans the time asked for:
copy ``k`` arrives ``k`` periods after the first, where a period is the trace's span plus
its mean gap between arrivals (so the tiled trace keeps the trace's own rate). Each copy
gets fresh request IDs, fresh session and parent IDs (``s`` becomes ``s#k``) and fresh
block IDs: a copy's ``hash_ids`` are shifted past every ID of the trace, so the prefix
reuse within a copy is the trace's own, and no copy hits a block of another (not even a
shared system prompt: each copy computes it once more, a cost the trace also pays once).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from replay.trace.record import TraceRequest
from router.errors import UserError

__all__ = ["copies_for", "tile", "tile_period_s"]


def tile_period_s(requests: Sequence[TraceRequest]) -> float:
    """Time between the starts of two copies: the span plus the mean inter-arrival gap."""
    if len(requests) < 2:
        raise UserError("tiling needs a trace of at least two requests")
    first = min(r.arrival_s for r in requests)
    last = max(r.arrival_s for r in requests)
    span = last - first
    if span <= 0:
        raise UserError("tiling needs a trace whose requests do not all arrive at once")
    return span + span / (len(requests) - 1)


def copies_for(requests: Sequence[TraceRequest], span_s: float) -> int:
    """How many copies make the tiled trace span at least ``span_s`` (trace time)."""
    return max(math.ceil(span_s / tile_period_s(requests)), 1)


def _suffix(value: str | None, k: int) -> str | None:
    return value if value is None or k == 0 else f"{value}#{k}"


def tile(requests: Sequence[TraceRequest], copies: int) -> list[TraceRequest]:
    """``copies`` back-to-back copies of ``requests`` (sorted by arrival), the first as is."""
    if copies < 1:
        raise UserError(f"tiling needs at least one copy, got {copies}")
    ordered = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
    period = tile_period_s(ordered) if copies > 1 else 0.0
    id_step = max(r.request_id for r in ordered) + 1
    ids = [h for r in ordered for h in r.hash_ids]
    block_step = max(ids) - min(ids) + 1 if ids else 0  # shifted past the trace's IDs
    out: list[TraceRequest] = []
    for k in range(copies):
        for r in ordered:
            out.append(
                replace(
                    r,
                    request_id=r.request_id + k * id_step,
                    arrival_s=r.arrival_s + k * period,
                    hash_ids=tuple(h + k * block_step for h in r.hash_ids),
                    session_id=_suffix(r.session_id, k),
                    parent_id=_suffix(r.parent_id, k),
                )
            )
    return out

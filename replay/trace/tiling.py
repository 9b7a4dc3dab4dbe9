"""Extend a short trace by tiling it: copies one after the other, each with fresh identities.

A capacity measured on a trace that the cluster swallows in a few seconds measures a
burst, not a steady state. ``tile`` repeats the trace until it spans the time asked for:
copy ``k`` arrives ``k`` periods after the first, where a period is the trace's span plus
its mean gap between arrivals (so the tiled trace keeps the trace's own rate). Each copy
gets fresh request IDs, fresh session and parent IDs (``s`` becomes ``s#k``) and fresh
block IDs: a copy's ``hash_ids`` are shifted past every ID of the trace, so the prefix
reuse within a copy is the trace's own, and no copy hits a block of another (not even a
shared system prompt: each copy computes it once more, a cost the trace also pays once).

``rotate`` starts the trace at a phase of its period, so that replays with different
seeds see different stretches of the same traffic: every session that begins before the
phase moves, whole, one period later (after the trace's end), keeping its requests'
order, gaps and parent links. ``seed_phase`` gives seed 0 no rotation and seed ``k`` the
fraction ``k x 0.618... mod 1`` (the golden ratio's), which spreads seeds evenly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from replay.trace.record import TraceRequest
from router.errors import UserError

__all__ = ["copies_for", "rotate", "seed_phase", "tile", "tile_period_s"]

GOLDEN_FRACTION = (math.sqrt(5.0) - 1.0) / 2.0


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


def seed_phase(seed: int) -> float:
    """The fraction of the period a seed's replay starts at: 0 for seed 0."""
    return (seed * GOLDEN_FRACTION) % 1.0


def rotate(requests: Sequence[TraceRequest], phase: float) -> list[TraceRequest]:
    """``requests`` (sorted by arrival) with every session whose first request arrives
    before ``first + phase x period`` moved one period later; a request without a session
    is a session of its own. Phase 0 leaves the trace as it is."""
    if not 0.0 <= phase < 1.0:
        raise UserError(f"a rotation's phase is a fraction of the period in [0, 1), got {phase}")
    ordered = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
    if phase == 0.0:
        return ordered
    period = tile_period_s(ordered)
    cut = ordered[0].arrival_s + phase * period
    starts: dict[str, float] = {}
    for r in ordered:
        if r.session_id is not None:
            starts.setdefault(r.session_id, r.arrival_s)
    moved = [
        replace(r, arrival_s=r.arrival_s + period)
        if (starts[r.session_id] if r.session_id is not None else r.arrival_s) < cut
        else r
        for r in ordered
    ]
    return sorted(moved, key=lambda r: (r.arrival_s, r.request_id))


def tile(
    requests: Sequence[TraceRequest], copies: int, *, period_s: float | None = None
) -> list[TraceRequest]:
    """``copies`` back-to-back copies of ``requests`` (sorted by arrival), the first as is,
    ``period_s`` apart (by default the trace's own ``tile_period_s``)."""
    if copies < 1:
        raise UserError(f"tiling needs at least one copy, got {copies}")
    ordered = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
    period = 0.0 if copies == 1 else period_s if period_s is not None else tile_period_s(ordered)
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

"""The common request record every trace reader yields."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TraceRequest"]


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace, whatever its source format.

    ``hash_ids`` are prefix-chained block IDs of ``block_size`` tokens (empty when the
    format carries no prefix information); two requests share a cached prefix exactly
    as far as their ``hash_ids`` agree from the start.
    """

    request_id: int
    arrival_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    block_size: int
    session_id: str | None = None
    parent_id: str | None = None
    turn: int | None = None
    kind: str | None = None  # e.g. Qwen-Bailian's request type ("text", "search", ...)

"""What the simulated engine's timing histograms add up."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RequestTimes"]


@dataclass(slots=True)
class RequestTimes:
    """Totals over the requests that produced a token, as vLLM's histograms count them:
    seconds from getting a slot to the first token, and from the first to the last (the
    sum of its inter-token gaps, ``gaps`` of them)."""

    requests: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    gaps: int = 0

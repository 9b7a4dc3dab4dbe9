"""What the simulated engine's timing histograms add up."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RequestTimes"]


@dataclass(slots=True)
class RequestTimes:
    """Totals as vLLM's histograms count them: over the requests that ended having
    produced a token, seconds from getting a slot to the first token (``prefill_s``) and
    from the first to the last (``decode_s``); and over every token after a request's
    first, counted as it is produced (vLLM observes inter-token latency each step, not
    when the request ends), the gap since the token before (``itl_s``, ``gaps`` of them)."""

    requests: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    itl_s: float = 0.0
    gaps: int = 0

    def token(self, gap_s: float) -> None:
        """A token ``gap_s`` after the same request's previous one."""
        self.itl_s += gap_s
        self.gaps += 1

"""A stream's output tokens and inter-token gaps, tallied where they happen and added to
the metric families every ``FLUSH_TOKENS`` tokens and at the stream's end.

A token relayed costs a few microseconds of the router's CPU in all; a histogram
observation (a lock and a walk over the buckets) and a counter increment for each were a
good part of it. The tally keeps the stream's own bucket counts, then adds them to the
histogram's in one step: what the histogram holds is what one observation per token gives
(``prometheus_client`` has no call that observes one value many times, so the tally adds
to the child's bucket and sum values itself).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from prometheus_client import Counter, Histogram

__all__ = ["FLUSH_TOKENS", "TokenTally"]

FLUSH_TOKENS = 64
"""Tokens a stream tallies before adding them to the metrics (a long stream's show while
it runs)."""


class TokenTally:
    """One stream's tokens (``generated``) and the gaps before them (``itl``, whose
    ``bounds`` are its buckets' upper bounds, +Inf left out)."""

    def __init__(self, itl: Histogram, generated: Counter, bounds: Sequence[float]) -> None:
        self._itl, self._generated, self._bounds = itl, generated, tuple(bounds)
        if tuple(itl._upper_bounds[:-1]) != self._bounds:  # counts added by position below
            raise ValueError(f"bounds {self._bounds} are not the histogram's buckets")
        self._counts = [0] * (len(self._bounds) + 1)  # the last: above every bound
        self._sum = 0.0
        self._tokens = 0  # tallied, not yet added
        self._gaps = 0  # of them, with a gap

    def add(self, n: int, gap_s: float | None) -> None:
        """``n`` tokens, each ``gap_s`` after the previous one (None: no previous one)."""
        self._tokens += n
        if gap_s is not None:
            self._counts[bisect_left(self._bounds, gap_s)] += n  # a bound holds what is <= it
            self._sum += gap_s * n
            self._gaps += n
        if self._tokens >= FLUSH_TOKENS:
            self.flush()

    def flush(self) -> None:
        """Add what was tallied to the metrics."""
        if self._tokens:
            self._generated.inc(self._tokens)
            self._tokens = 0
        if not self._gaps:
            return
        buckets = self._itl._buckets
        for i, count in enumerate(self._counts):
            if count:
                buckets[i].inc(count)
                self._counts[i] = 0
        self._itl._sum.inc(self._sum)
        self._sum, self._gaps = 0.0, 0

"""How long something was busy: a running total of the intervals it worked in.

A server (a P instance's prefill, a decode batch, a line's transfers) says when it starts
and stops working; ``busy_s(now)`` is the time it has worked so far, counting the
interval still open. Its utilization over a window is the busy time gained over the window
divided by the window's length (not a sample of busy or idle at one instant).
"""

from __future__ import annotations

__all__ = ["BusyTime"]


class BusyTime:
    """Accumulated busy seconds; ``set(busy, now)`` on every change of state."""

    __slots__ = ("_since", "_total")

    def __init__(self) -> None:
        self._since: float | None = None  # when the open busy interval began
        self._total = 0.0  # busy seconds of the closed intervals

    def set(self, busy: bool, now: float) -> None:
        """The server is (still) busy or idle from ``now`` on."""
        since = self._since
        if busy:
            if since is None:
                self._since = now
        elif since is not None:
            self._total += now - since
            self._since = None

    @property
    def busy(self) -> bool:
        return self._since is not None

    def busy_s(self, now: float) -> float:
        """Busy seconds until ``now`` (the open interval counted up to it)."""
        since = self._since
        return self._total if since is None else self._total + (now - since)

"""The WAN's backlog as the router has committed it: the bytes it sent across and not yet drained.

Engines do not report the line's queue, but the router knows every KV copy it starts
across datacenters (a decision's ``predicted_wan_bytes``). The ledger models the line as
a fluid queue drained at its bandwidth: each copy adds its bytes, time drains them in
the order they were committed. Its backlog and the count of copies not yet drained are
what the policies read from ``ClusterView.wan`` (``backlog_bytes``, ``active_transfers``),
as the simulator gives them in replay. Each router replica counts its own copies.
"""

from __future__ import annotations

from collections import deque

from policies.types import LinkState

__all__ = ["WanLedger"]


class WanLedger:
    """A fluid queue of committed copies, written into ``link`` at every ``sync``."""

    def __init__(self, link: LinkState) -> None:
        self.link = link
        self._ends: deque[float] = deque()  # cumulative bytes at which each copy drains
        self._committed = 0.0  # bytes committed since the start
        self._drained = 0.0  # bytes the line has carried since the start
        self._at: float | None = None

    def sync(self, now: float) -> None:
        """Drain what the line carried since the last call; update the link's state."""
        if self._at is not None and now > self._at:
            carried = (now - self._at) * self.link.bandwidth_bps
            self._drained = min(self._drained + carried, self._committed)
        self._at = now if self._at is None else max(now, self._at)
        while self._ends and self._ends[0] <= self._drained:
            self._ends.popleft()
        self.link.backlog_bytes = self._committed - self._drained
        self.link.active_transfers = len(self._ends)

    def commit(self, nbytes: float, now: float) -> None:
        """A copy of ``nbytes`` starts across the line now."""
        self.sync(now)
        if nbytes <= 0:
            return
        self._committed += nbytes
        self._ends.append(self._committed)
        self.link.backlog_bytes = self._committed - self._drained
        self.link.active_transfers = len(self._ends)

"""A plain heap event loop: events ordered by (time, priority, sequence)."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

__all__ = ["EventLoop", "Handler"]

Handler = Callable[[Any], None]
"""What an event runs: called with the argument it was scheduled with."""


class EventLoop:
    """Simulated time and the pending events.

    Ties at the same time are broken by the event's priority, then by the order of
    scheduling, so a run is fully determined by its inputs. Components that need to
    move a pending event (a completion time recomputed) do not remove it: they
    schedule a new one and let the old one find itself stale (lazy invalidation).
    """

    __slots__ = ("_heap", "_seq", "events", "now")

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self.events = 0  # events run so far
        self._heap: list[tuple[float, int, int, Handler, Any]] = []
        self._seq = 0

    def clock(self) -> float:
        """The simulated time, as a clock callable for components that want one."""
        return self.now

    def at(self, time: float, priority: int, handler: Handler, arg: Any = None) -> None:
        """Run ``handler(arg)`` at ``time`` (never before now)."""
        self._seq += 1
        if time < self.now:
            time = self.now
        heapq.heappush(self._heap, (time, priority, self._seq, handler, arg))

    def after(self, delay: float, priority: int, handler: Handler, arg: Any = None) -> None:
        """Run ``handler(arg)`` ``delay`` seconds from now."""
        now = self.now
        time = now + delay
        self._seq += 1
        heapq.heappush(self._heap, (now if time < now else time, priority, self._seq, handler, arg))

    def pending(self) -> int:
        return len(self._heap)

    def run(self, until: float | None = None) -> None:
        """Run events in order until none is left (or the next is later than ``until``)."""
        heap = self._heap
        pop = heapq.heappop
        count = 0
        while heap:
            if until is not None and heap[0][0] > until:
                break
            time, _prio, _seq, handler, arg = pop(heap)
            self.now = time
            count += 1
            handler(arg)
        self.events += count
        if until is not None and until > self.now:
            self.now = until

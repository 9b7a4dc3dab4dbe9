"""Egalitarian processor sharing as a fluid: members advance together, one event pending.

Both the decode batch of an instance (every running request advances one token per
step) and a network link (every active transfer gets an equal share of the
bandwidth) are this process with a different rate function. All members advance at
the same rate, so one counter ``v`` (progress per member since the process began)
describes them all: a member that joined at ``v0`` with ``amount`` to do finishes
when ``v`` reaches ``v0 + amount``. Targets sit in a heap; only the earliest one has
an event in the loop. Whenever membership (hence the rate) changes, the counter is
advanced to now, the rate recomputed and a new completion event scheduled; the old
event carries an older version number and is ignored when it fires.
"""

from __future__ import annotations

import heapq

from replay.sim.busy_time import BusyTime
from replay.sim.event_loop import EventLoop

__all__ = ["SharedProgress"]


class SharedProgress:
    """Members advance together at ``rate`` units per second each (subclasses define it)."""

    __slots__ = (
        "_heap",
        "_loop",
        "_members",
        "_priority",
        "_sum_start",
        "_sum_target",
        "_t",
        "_version",
        "busy_time",
        "rate",
        "v",
    )

    def __init__(self, loop: EventLoop, priority: int) -> None:
        self._loop = loop
        self._priority = priority
        self.v = 0.0
        self._t = loop.now
        self.rate = 0.0
        self._members: dict[int, tuple[float, float]] = {}  # key -> (start v, target v)
        self._heap: list[tuple[float, int]] = []
        self._version = 0
        self._sum_start = 0.0
        self._sum_target = 0.0
        self.busy_time = BusyTime()  # while it has members (a batch decoding, a line sending)

    # -- what subclasses define -------------------------------------------------------

    def _compute_rate(self) -> float:
        """Progress per second of each member, given the current membership (n > 0)."""
        raise NotImplementedError

    def _rate_changed(self, rate: float) -> None:
        """Hook: the rate has just changed (0 when empty)."""

    def _detach(self, key: int) -> None:
        """Hook: a member is leaving (before the rate is recomputed)."""

    def _completed(self, key: int) -> None:
        """Hook: a member reached its target (it is already removed)."""

    # -- state ------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return len(self._members)

    def __contains__(self, key: int) -> bool:
        return key in self._members

    def advance(self) -> None:
        """Bring the counter to the loop's current time."""
        now = self._loop.now
        if now > self._t:
            self.v += self.rate * (now - self._t)
            self._t = now

    def progress_of(self, key: int) -> float:
        """Progress of a member since it joined, now."""
        self.advance()
        return self.v - self._members[key][0]

    def total_progress(self) -> float:
        """Sum over members of their progress since joining, now."""
        now = self._loop.now
        if now > self._t:  # advance(), inline
            self.v += self.rate * (now - self._t)
            self._t = now
        return len(self._members) * self.v - self._sum_start

    def backlog(self) -> float:
        """Sum over members of the work they still have to do, now."""
        self.advance()
        return max(self._sum_target - len(self._members) * self.v, 0.0)

    def until_next_s(self) -> float:
        """Seconds until the next member reaches its target at the current rate (inf if
        none will)."""
        target = self._next_target()
        if target is None or self.rate <= 0.0:
            return float("inf")
        self.advance()
        return max((target - self.v) / self.rate, 0.0)

    def _next_target(self) -> float | None:
        """The earliest live target (stale heap entries dropped on the way), or None."""
        heap, members = self._heap, self._members
        while heap:
            target, key = heap[0]
            entry = members.get(key)
            if entry is not None and entry[1] == target:
                return target
            heapq.heappop(heap)
        return None

    # -- membership -------------------------------------------------------------------

    def add(self, key: int, amount: float) -> None:
        """A member joins with ``amount`` units of work."""
        self.advance()
        v = self.v
        target = v + amount
        self._members[key] = (v, target)
        heapq.heappush(self._heap, (target, key))
        self._sum_start += v
        self._sum_target += target
        self.refresh()

    def remove(self, key: int) -> float:
        """A member leaves before its target; returns its progress."""
        self.advance()
        start, target = self._members.pop(key)
        self._detach(key)
        self._sum_start -= start
        self._sum_target -= target
        if not self._members:
            self._sum_start = self._sum_target = 0.0
        self.refresh()
        return self.v - start

    def refresh(self) -> None:
        """Recompute the rate (something it depends on changed) and reschedule."""
        now = self._loop.now
        if now > self._t:  # advance(), inline
            self.v += self.rate * (now - self._t)
            self._t = now
        members = self._members
        self.busy_time.set(bool(members), now)
        rate = self._compute_rate() if members else 0.0
        if rate != self.rate:
            self.rate = rate
            self._rate_changed(rate)
        self._version += 1
        target = self._next_target()
        if target is not None and rate > 0.0:
            delay = (target - self.v) / rate
            self._loop.after(
                delay if delay > 0.0 else 0.0, self._priority, self._fire, self._version
            )

    def _fire(self, version: int) -> None:
        if version != self._version:
            return  # stale: membership changed since this was scheduled
        self.advance()
        heap, members = self._heap, self._members
        if heap and heap[0][0] > self.v:
            self.v = heap[0][0]  # this event was computed for exactly that target
        limit = self.v + 1e-9 * max(1.0, abs(self.v))
        done: list[int] = []
        while heap and heap[0][0] <= limit:
            target, key = heapq.heappop(heap)
            entry = members.get(key)
            if entry is None or entry[1] != target:
                continue
            del members[key]
            self._detach(key)
            self._sum_start -= entry[0]
            self._sum_target -= target
            done.append(key)
        if not members:
            self._sum_start = self._sum_target = 0.0
        self.refresh()
        for key in done:
            self._completed(key)

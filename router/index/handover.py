"""Handing an instance's KV events over between replicas sharing one index.

Every replica receives an instance's KV events and keeps them in its mirror, but only
the one ``kv_writer`` names (a lease in Redis) writes them to the shared index; the
others keep them for ``hold_s``, so the replica that takes the instance over writes what
the shared index may have missed meanwhile (``take_over``).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from router.index.base import Clock

__all__ = ["ReplicaHandover"]

_HELD_MAX = 100_000  # KV-event updates kept per instance for a take-over, at most

Send = Callable[[str, tuple[Any, ...]], None]


class ReplicaHandover:
    """Which KV-event updates this replica writes, and those it keeps for a take-over."""

    def __init__(self, send: Send, clock: Clock) -> None:
        """``send``: an update to the shared index (or its outage log)."""
        self._send = send
        self._clock = clock
        # whether this replica writes an instance's KV events (None: it writes them all)
        self.kv_writer: Callable[[str], bool] | None = None
        self.hold_s = 10.0
        self._ingesting: str | None = None
        self._held: dict[str, deque[tuple[float, str, tuple[Any, ...]]]] = {}
        self._started = clock()  # KV events are kept from then on

    @contextlib.contextmanager
    def kv_events_of(self, instance_id: str) -> Iterator[None]:
        """Within: the index's updates are the instance's KV events."""
        self._ingesting = instance_id
        try:
            yield
        finally:
            self._ingesting = None

    def withheld(self, name: str, args: tuple[Any, ...]) -> bool:
        """Whether an update is a KV event another replica writes: then it is kept for
        ``hold_s`` instead of being sent."""
        instance_id, writer = self._ingesting, self.kv_writer
        if instance_id is None or writer is None or writer(instance_id):
            return False
        now = self._clock()
        held = self._held.setdefault(instance_id, deque(maxlen=_HELD_MAX))
        held.append((now, name, args))
        while held and held[0][0] < now - self.hold_s:
            held.popleft()
        return True

    def take_over(self, instance_id: str, unwritten_s: float | None = None) -> tuple[int, bool]:
        """This replica now writes the instance's KV events: send the shared index the
        ones it kept from the last ``hold_s``, in order (replaying a stretch of stores,
        removals and clears that the shared index partly has leaves it as the whole
        stretch does).

        ``unwritten_s``: how long nobody wrote them (None: unknown, or never written). When
        that stretch began before what this replica kept (it started since, or kept less
        than ``hold_s``), the shared index may hold blocks the engine evicted meanwhile:
        the instance is cleared there first and written again from what was kept, as after
        a gap. Returns (updates sent or queued, whether the instance was cleared)."""
        held = self._held.pop(instance_id, None) or deque()
        now = self._clock()
        since = now - self.hold_s
        complete_since = max(since, self._started)
        if held and held.maxlen is not None and len(held) == held.maxlen:
            complete_since = max(complete_since, held[0][0])
        cleared = unwritten_s is not None and now - unwritten_s < complete_since
        if cleared:
            self._send("clear", (instance_id,))
        sent = 0
        for at, name, args in held:
            if at >= since:
                self._send(name, args)
                sent += 1
        return sent, cleared

    def forget_held(self, instance_id: str) -> None:
        """Drop the updates kept for an instance (it was removed)."""
        self._held.pop(instance_id, None)

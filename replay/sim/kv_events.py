"""KV events from the simulated engines to the router's index, after a delivery delay."""

from __future__ import annotations

from collections.abc import Sequence

from replay.sim.event_loop import EventLoop
from replay.sim.events import Priority
from router.index.base import PrefixIndex

__all__ = ["KV_EVENT_DELAY_S", "KvEventFeed"]

KV_EVENT_DELAY_S = 0.05
"""Default seconds between an engine storing or evicting blocks and the index hearing it."""


class KvEventFeed:
    """Engines publish "stored chain" and "removed blocks"; the index hears it later.

    The delay stands for the engine's event batching and the transport (ZMQ, the
    router's consumer): decisions in the meantime see a stale index, as in
    production. A delay of 0 applies events immediately. A disabled feed (approximate
    mode: engines that publish no KV events) counts the events and delivers none.
    """

    __slots__ = ("_index", "_loop", "delay_s", "enabled", "removed_events", "stored_events")

    def __init__(
        self, loop: EventLoop, index: PrefixIndex, delay_s: float, *, enabled: bool = True
    ) -> None:
        self._loop = loop
        self._index = index
        self.delay_s = delay_s
        self.enabled = enabled
        self.stored_events = 0
        self.removed_events = 0

    def stored(self, instance_id: str, chain: Sequence[int]) -> None:
        if not chain:
            return
        self.stored_events += 1
        if not self.enabled:
            return
        if self.delay_s <= 0.0:
            self._index.store(instance_id, chain)
        else:
            self._loop.after(self.delay_s, Priority.KV_EVENT, self._store, (instance_id, chain))

    def removed(self, instance_id: str, blocks: Sequence[int]) -> None:
        if not blocks:
            return
        self.removed_events += 1
        if not self.enabled:
            return
        if self.delay_s <= 0.0:
            self._index.remove(instance_id, blocks)
        else:
            self._loop.after(self.delay_s, Priority.KV_EVENT, self._remove, (instance_id, blocks))

    def _store(self, event: tuple[str, Sequence[int]]) -> None:
        self._index.store(*event)

    def _remove(self, event: tuple[str, Sequence[int]]) -> None:
        self._index.remove(*event)

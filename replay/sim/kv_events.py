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

    __slots__ = (
        "_index", "_loop", "delay_s", "enabled", "remote", "remote_delay_s", "removed_events",
        "stored_events",
    )  # fmt: skip

    def __init__(
        self,
        loop: EventLoop,
        index: PrefixIndex,
        delay_s: float,
        *,
        enabled: bool = True,
        remote: frozenset[str] = frozenset(),
        remote_delay_s: float = 0.0,
    ) -> None:
        """``remote``: instances in another datacenter than the router's, whose events cross
        the line between them and so reach the index ``remote_delay_s`` later still."""
        self._loop = loop
        self._index = index
        self.delay_s = delay_s
        self.enabled = enabled
        self.remote = remote
        self.remote_delay_s = remote_delay_s
        self.stored_events = 0
        self.removed_events = 0

    def _delay(self, instance_id: str) -> float:
        if self.remote_delay_s and instance_id in self.remote:
            return self.delay_s + self.remote_delay_s
        return self.delay_s

    def stored(self, instance_id: str, chain: Sequence[int]) -> None:
        if not chain:
            return
        self.stored_events += 1
        if not self.enabled:
            return
        delay = self._delay(instance_id)
        if delay <= 0.0:
            self._index.store(instance_id, chain)
        else:
            self._loop.after(delay, Priority.KV_EVENT, self._store, (instance_id, chain))

    def removed(self, instance_id: str, blocks: Sequence[int]) -> None:
        if not blocks:
            return
        self.removed_events += 1
        if not self.enabled:
            return
        delay = self._delay(instance_id)
        if delay <= 0.0:
            self._index.remove(instance_id, blocks)
        else:
            self._loop.after(delay, Priority.KV_EVENT, self._remove, (instance_id, blocks))

    def _store(self, event: tuple[str, Sequence[int]]) -> None:
        self._index.store(*event)

    def _remove(self, event: tuple[str, Sequence[int]]) -> None:
        self._index.remove(*event)

"""A shared index that keeps deciding through a Redis outage and catches up afterwards.

Every update goes to a local in-memory mirror and to the shared index. While the
shared index is unreachable, matches are answered from the mirror (the replica's
own view: what it routed and the KV events it ingested), updates queue in a
bounded log, and the index is flagged degraded. Once the shared index answers
again, the log is replayed so the other replicas see what happened meanwhile.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from redis.exceptions import RedisError

from policies.tiers import Tier
from router.errors import UserError
from router.index.base import Clock, IndexedInstance, PrefixIndex
from router.index.memory_index import MemoryPrefixIndex

__all__ = ["ResilientIndex"]

_OUTAGE = (RedisError, UserError, OSError)
T = TypeVar("T")


class ResilientIndex:
    """PrefixIndex over a shared ``primary`` with a local mirror for outages."""

    def __init__(
        self,
        primary: PrefixIndex,
        *,
        default_capacity_blocks: int | None = None,
        ttl_s: float | None = None,
        retry_after_s: float = 1.0,
        max_pending: int = 100_000,
        clock: Clock = time.monotonic,
    ) -> None:
        self.primary = primary
        self.local = MemoryPrefixIndex(
            default_capacity_blocks=default_capacity_blocks, ttl_s=ttl_s, clock=clock
        )
        self.degraded = False
        self.dropped_updates = 0
        self._retry_after = retry_after_s
        self._clock = clock
        self._next_try = 0.0
        self._pending: deque[tuple[str, tuple[Any, ...]]] = deque(maxlen=max_pending)

    # -- plumbing ---------------------------------------------------------------
    def _primary_up(self) -> bool:
        """True when the primary may be used now (replaying the log if it just came back)."""
        if not self.degraded:
            return True
        if self._clock() < self._next_try:
            return False
        try:
            while self._pending:
                name, args = self._pending[0]
                getattr(self.primary, name)(*args)
                self._pending.popleft()
        except _OUTAGE:
            self._next_try = self._clock() + self._retry_after
            return False
        self.degraded = False
        return True

    def _down(self) -> None:
        self.degraded = True
        self._next_try = self._clock() + self._retry_after

    def _update(self, name: str, *args: Any) -> None:
        getattr(self.local, name)(*args)
        if self._primary_up():
            try:
                getattr(self.primary, name)(*args)
                return
            except _OUTAGE:
                self._down()
        if len(self._pending) == self._pending.maxlen:
            self.dropped_updates += 1
        self._pending.append((name, args))

    def _read(self, primary: Callable[[], T], local: Callable[[], T]) -> T:
        if self._primary_up():
            try:
                return primary()
            except _OUTAGE:
                self._down()
        return local()

    # -- the contract -------------------------------------------------------------
    def register(self, instance: IndexedInstance) -> None:
        self._update("register", instance)

    def unregister(self, instance_id: str) -> None:
        self._update("unregister", instance_id)

    def instances(self) -> list[IndexedInstance]:
        return self._read(self.primary.instances, self.local.instances)

    def store(self, instance_id: str, chain: Sequence[int]) -> None:
        self._update("store", instance_id, tuple(chain))

    def remove(self, instance_id: str, blocks: Sequence[int]) -> None:
        self._update("remove", instance_id, tuple(blocks))

    def clear(self, instance_id: str) -> None:
        self._update("clear", instance_id)

    def match(
        self, chain: Sequence[int], *, tier: Tier | None = None, datacenter: str | None = None
    ) -> dict[str, int]:
        return self._read(
            lambda: self.primary.match(chain, tier=tier, datacenter=datacenter),
            lambda: self.local.match(chain, tier=tier, datacenter=datacenter),
        )

    def num_blocks(self, instance_id: str) -> int:
        return self._read(
            lambda: self.primary.num_blocks(instance_id),
            lambda: self.local.num_blocks(instance_id),
        )

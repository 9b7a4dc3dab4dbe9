"""A prefix index that also remembers when each block was stored: the predictor's context.

``TrackedIndex`` wraps any :class:`~router.index.base.PrefixIndex` and passes every call
through; on the way it keeps, per instance, when each block was last stored and a
counter of blocks inserted so far, plus decayed rates of stores and removals. From
these the features read the age of a match, how many blocks an instance took in
since, and how many distinct blocks it touched since (``TouchOrder``: an LRU cache of C
blocks evicts a block once C others were touched after it), whichever way the index is
fed: engines' KV events, or the router's own record of its routes.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from policies.tiers import Tier
from router.index.base import Clock, IndexedInstance, PrefixIndex, UnknownInstanceError
from router.predictor.recency import TouchOrder

__all__ = ["InstanceActivity", "TrackedIndex"]

_DEFAULT_MAX_BLOCKS = 1_000_000


class InstanceActivity:
    """Store and removal history of one instance as the index heard it."""

    __slots__ = (
        "_evict_rate",
        "_rate_t",
        "_store_rate",
        "capacity",
        "inserted",
        "order",
        "removed",
        "touch",
    )

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity  # blocks remembered (the instance's capacity when known)
        # block -> (t, inserted, stamp): when it was last touched, blocks inserted by then,
        # and its stamp in ``order``
        self.touch: OrderedDict[int, tuple[float, int, int]] = OrderedDict()
        self.order = TouchOrder()  # live blocks per stamp: distinct blocks touched since
        self.inserted = 0  # blocks newly stored so far
        self.removed = 0  # blocks removed so far (KV events only)
        self._store_rate = 0.0
        self._evict_rate = 0.0
        self._rate_t = 0.0

    def _decay(self, now: float, tau: float) -> None:
        if now > self._rate_t:
            factor = math.exp(-(now - self._rate_t) / tau)
            self._store_rate *= factor
            self._evict_rate *= factor
            self._rate_t = now

    def rates(self, now: float, tau: float) -> tuple[float, float]:
        """Blocks stored and removed per second, exponentially weighted over ``tau``."""
        self._decay(now, tau)
        return self._store_rate, self._evict_rate

    def _restamp(self, mapping: dict[int, int]) -> None:
        touch = self.touch
        for block, (t, inserted, stamp) in touch.items():
            touch[block] = (t, inserted, mapping[stamp])

    def _forget(self, stamps: Iterable[int]) -> None:
        gone: dict[int, int] = {}
        for stamp in stamps:
            gone[stamp] = gone.get(stamp, 0) + 1
        for stamp, n in gone.items():
            self.order.add(stamp, -n)

    def stored(self, chain: Sequence[int], now: float, tau: float) -> None:
        touch = self.touch
        stamp, mapping = self.order.new_stamp()
        if mapping is not None:
            self._restamp(mapping)
        before = self.inserted
        new = 0
        again: list[int] = []  # the earlier stamps of blocks touched again
        # Last block first, as the index does: parents end up more recent than children.
        for block in reversed(chain):
            known = touch.get(block)
            if known is not None:
                touch.move_to_end(block)
                again.append(known[2])
            else:
                new += 1
                touch[block] = (now, 0, stamp)
        self._forget(again)
        self.order.add(stamp, new + len(again))
        self.inserted += new
        mark = (now, self.inserted, stamp)  # the chain's own new blocks do not count as newer
        for block in chain:
            touch[block] = mark
        evicted: list[int] = []
        while len(touch) > self.capacity:
            evicted.append(touch.popitem(last=False)[1][2])
        self._forget(evicted)
        self._decay(now, tau)
        self._store_rate += (self.inserted - before) / tau

    def removed_blocks(self, blocks: Sequence[int], now: float, tau: float) -> None:
        stamps = [known[2] for b in blocks if (known := self.touch.pop(b, None)) is not None]
        self._forget(stamps)
        gone = len(stamps)
        self.removed += gone
        self._decay(now, tau)
        self._evict_rate += gone / tau


class TrackedIndex:
    """PrefixIndex that forwards to ``inner`` and records each instance's activity."""

    def __init__(
        self,
        inner: PrefixIndex,
        clock: Clock,
        *,
        rate_window_s: float = 60.0,
        max_blocks: int = _DEFAULT_MAX_BLOCKS,
    ) -> None:
        if rate_window_s <= 0:
            raise ValueError(f"rate_window_s must be positive, got {rate_window_s}")
        self.inner = inner
        self.clock = clock
        self.rate_window_s = rate_window_s
        self._max_blocks = max_blocks
        self._activity: dict[str, InstanceActivity] = {}
        # called with (instance, blocks) on every removal, (instance, None) on a clear
        self.removal_listeners: list[Callable[[str, Sequence[int] | None], None]] = []

    def activity(self, instance_id: str) -> InstanceActivity | None:
        return self._activity.get(instance_id)

    # -- the contract, forwarded --------------------------------------------------------

    def register(self, instance: IndexedInstance) -> None:
        self.inner.register(instance)
        capacity = instance.capacity_blocks or self._max_blocks
        known = self._activity.get(instance.instance_id)
        if known is None:
            self._activity[instance.instance_id] = InstanceActivity(capacity)
        else:
            known.capacity = capacity

    def unregister(self, instance_id: str) -> None:
        self.inner.unregister(instance_id)
        self._activity.pop(instance_id, None)

    def instances(self) -> list[IndexedInstance]:
        return self.inner.instances()

    def store(self, instance_id: str, chain: Sequence[int]) -> None:
        self.inner.store(instance_id, chain)
        activity = self._activity.get(instance_id)
        if activity is not None:
            activity.stored(chain, self.clock(), self.rate_window_s)

    def store_many(self, items: Sequence[tuple[str, Sequence[int]]]) -> None:
        try:
            self.inner.store_many(items)
        except UnknownInstanceError:  # the others were stored
            self._stored_many(items)
            raise
        self._stored_many(items)

    def _stored_many(self, items: Sequence[tuple[str, Sequence[int]]]) -> None:
        for instance_id, chain in items:
            activity = self._activity.get(instance_id)
            if activity is not None:
                activity.stored(chain, self.clock(), self.rate_window_s)

    def remove(self, instance_id: str, blocks: Sequence[int]) -> None:
        self.inner.remove(instance_id, blocks)
        for listener in self.removal_listeners:
            listener(instance_id, blocks)
        activity = self._activity.get(instance_id)
        if activity is not None:
            activity.removed_blocks(blocks, self.clock(), self.rate_window_s)

    def clear(self, instance_id: str) -> None:
        self.inner.clear(instance_id)
        for listener in self.removal_listeners:
            listener(instance_id, None)
        activity = self._activity.get(instance_id)
        if activity is not None:
            activity.removed_blocks(list(activity.touch), self.clock(), self.rate_window_s)

    def match(
        self, chain: Sequence[int], *, tier: Tier | None = None, datacenter: str | None = None
    ) -> dict[str, int]:
        return self.inner.match(chain, tier=tier, datacenter=datacenter)

    def num_blocks(self, instance_id: str) -> int:
        return self.inner.num_blocks(instance_id)

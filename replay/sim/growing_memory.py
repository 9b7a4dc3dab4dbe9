"""On-demand KV memory of an instance whose running requests grow with its decode batch.

vLLM and SGLang give a request memory for its prompt when it is admitted and a block
more as it generates. In the fluid batch every running request gains tokens at the
step rate, so the generated tokens held grow at ``batch size x rate`` and the moment
the memory fills is known in advance: it has one event, moved whenever the batch or
the memory changes. When it comes, unpinned cached blocks are evicted ahead (a slice
of the memory at a time); when none is left the instance preempts a request (it
chooses which). A request alone on its instance is never preempted: it could not
come back, so it overcommits instead.
"""

from __future__ import annotations

from collections.abc import Callable

from replay.sim.decode_batch import DecodeBatch
from replay.sim.event_loop import EventLoop
from replay.sim.events import Priority
from replay.sim.kv_memory import KvMemory

__all__ = ["GrowingMemory"]

EVICT_SLICE = 1 / 32
"""Share of the memory evicted ahead each time the growing batch reaches the cached blocks."""


class GrowingMemory:
    """Keeps ``cache.grown`` up to date and evicts or preempts when the batch fills it."""

    __slots__ = ("_batch", "_cache", "_evicted", "_loop", "_preempt", "_version", "base")

    def __init__(
        self,
        loop: EventLoop,
        cache: KvMemory,
        batch: DecodeBatch,
        preempt: Callable[[], object],
        evicted: Callable[[], None],
    ) -> None:
        """``preempt()`` frees a request; ``evicted()`` follows an eviction ahead (the
        instance updates what the router sees and calls ``arm`` again)."""
        self._loop = loop
        self._cache = cache
        self._batch = batch
        self._preempt = preempt
        self._evicted = evicted
        self._version = 0
        self.base = 0  # generated tokens the running requests held when they (re)started

    def refresh(self) -> None:
        """Bring ``cache.grown`` to now."""
        self._cache.grown = self.base + self._batch.total_progress()

    def arm(self) -> None:
        """Schedule the moment the memory fills, if it comes before the batch's next
        change (which arms it again). Call after every change of the batch or memory."""
        batch, cache = self._batch, self._cache
        self._version += 1  # whatever was scheduled is stale now
        cache.grown = self.base + batch.total_progress()  # refresh(), inline
        n = batch.size
        rate = batch.rate
        if n == 0 or rate <= 0.0:
            return
        free = cache.capacity_tokens - cache.used_tokens
        if free <= 0.0 and cache.evictable_tokens == 0 and n == 1:
            return
        delay = (0.0 if free < 0.0 else free) / (n * rate)  # max(free, 0.0)
        if delay >= batch.until_next_s():
            return
        self._loop.after(delay, Priority.DECODE, self._full, self._version)

    def _full(self, version: int) -> None:
        if version != self._version:
            return  # stale: the batch or the memory changed since
        cache = self._cache
        self.refresh()
        if cache.used_tokens < cache.capacity_tokens - 1e-6 * cache.capacity_tokens:
            self.arm()  # not full after all (rounding): wait for the real moment
        elif cache.evictable_tokens > 0:
            cache.make_room(spare_tokens=max(cache.capacity_tokens * EVICT_SLICE, cache.block_size))
            self._evicted()
        elif self._batch.size > 1:
            self._preempt()  # the instance frees memory and arms again, or finds no
            # request it could take back later and overcommits until the batch changes

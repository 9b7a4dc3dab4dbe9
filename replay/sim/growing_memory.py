"""On-demand KV memory of an instance whose running requests grow with its decode batch.

vLLM and SGLang give a request memory for its prompt when it is admitted and a block
more as it generates. In the fluid batch every running request gains tokens at the
step rate, so the generated tokens held grow at ``batch size x rate`` and the moment
the memory fills is known in advance: it has one event, moved whenever the batch or
the memory changes. When it comes, unpinned cached blocks are evicted ahead (a slice
of the memory at a time); when none is left the instance preempts a request (it
chooses which). A request alone on its instance is never preempted: it could not
come back, so it overcommits instead.

An engine with KV pages (``KvMemory.page_tokens``) takes its memory a page at a time: a
request's prompt is admitted with its last page whole, its first tokens fill that page,
and it takes another only when its context passes the page's end. Counting generated
tokens one by one on top of the admitted pages would charge a batch admitted together
for the room its last pages still have (up to a page per request), and fill the memory
too early. With pages, each running request's memory is counted in whole pages of its
context (``join`` gives what the plain count holds of it), and the memory fills at the
moment the batch's page crossings use up the free pages: the free pages' count plus one
crossings later, the crossings of the requests following each other a page apart.
"""

from __future__ import annotations

import heapq
import math
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

    __slots__ = (
        "_batch",
        "_cache",
        "_evicted",
        "_held",
        "_loop",
        "_page",
        "_preempt",
        "_version",
        "base",
    )

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
        self._page = cache.page_tokens if cache.page_tokens and cache.page_tokens > 1 else None
        # per running request: what the plain count held of it when it joined the batch
        self._held: dict[int, int] = {}

    def join(self, key: int, held_tokens: int) -> None:
        """Request ``key`` joins the batch holding ``held_tokens`` of memory (its blocks
        and reservation, and what ``base`` counts of it)."""
        if self._page is not None:
            self._held[key] = held_tokens

    def forget(self, key: int) -> None:
        """Request ``key`` has left the batch."""
        self._held.pop(key, None)

    def refresh(self) -> None:
        """Bring ``cache.grown`` to now."""
        if self._page is None:
            self._cache.grown = self.base + self._batch.total_progress()
        else:
            self._cache.grown = self._in_pages()[0]

    def _in_pages(self) -> tuple[int, list[float]]:
        """The running requests' growth in whole pages (a whole number of tokens), and the
        tokens each has until it takes its next page."""
        page = self._page
        assert page is not None
        held = self._held
        grown = self.base
        room: list[float] = []
        for key, context in self._batch.contexts():
            # a step over C tokens of context holds the pages of C tokens (the token it
            # computes, sampled by the step before, included): C = context rounded down
            end = (math.floor((context - 1.0) / page) + 1) * page
            # the next page is taken when the context passes the end by a token (timed a
            # millionth of a token past it, so that the crossing has happened by then)
            room.append(end + 1.0 - context + 1e-6)
            grown += end - held.get(key, end)
        return grown, room

    def arm(self) -> None:
        """Schedule the moment the memory fills, if it comes before the batch's next
        change (which arms it again). Call after every change of the batch or memory."""
        batch, cache = self._batch, self._cache
        self._version += 1  # whatever was scheduled is stale now
        n = batch.size
        rate = batch.rate
        cache.grown = self.base + batch.total_progress()  # refresh(), inline (tokens)
        page = self._page
        room: list[float] = []
        if page is not None:
            # counted in pages, each request is within a page of its count in tokens: far
            # from full, the memory cannot fill before the tokens leave a page a request
            # free, and only then is it counted in pages (which costs a pass over the batch)
            margin = n * page
            free = cache.capacity_tokens - cache.used_tokens - margin
            if n > 0 and rate > 0.0 and free > margin:
                self._at(free / (n * rate), self._recount)
                return
            cache.grown, room = self._in_pages()
        if n == 0 or rate <= 0.0:
            return
        free = cache.capacity_tokens - cache.used_tokens
        if free <= 0.0 and cache.evictable_tokens == 0 and n == 1:
            return
        if free < 0.0:
            delay = 0.0
        elif page is None:
            delay = free / (n * rate)
        else:  # the crossing that finds no free page: each request crosses a page apart
            rounds, first = divmod(int(free // page), n)
            delay = (heapq.nsmallest(first + 1, room)[-1] + rounds * page) / rate
            if self._loop.now + delay <= self._loop.now:  # below the clock's resolution
                delay = math.ulp(self._loop.now)
        self._at(delay, self._full)

    def _at(self, delay: float, then: Callable[[int], None]) -> None:
        """``then(version)`` in ``delay`` seconds, unless the batch changes first."""
        if delay < self._batch.until_next_s():
            self._loop.after(delay, Priority.DECODE, then, self._version)

    def _recount(self, version: int) -> None:
        """The memory may be within a page a request of full: count it in pages."""
        if version == self._version:
            self.arm()

    def _full(self, version: int) -> None:
        if version != self._version:
            return  # stale: the batch or the memory changed since
        cache = self._cache
        self.refresh()
        if self._page is None:
            full = cache.used_tokens >= cache.capacity_tokens - 1e-6 * cache.capacity_tokens
        else:  # whole pages: the memory can be exactly full, and overflows at a crossing
            full = cache.used_tokens > cache.capacity_tokens
        if not full:
            self.arm()  # not full after all (rounding): wait for the real moment
        elif cache.evictable_tokens > 0:
            cache.make_room(spare_tokens=max(cache.capacity_tokens * EVICT_SLICE, cache.block_size))
            self._evicted()
        elif self._batch.size > 1:
            self._preempt()  # the instance frees memory and arms again, or finds no
            # request it could take back later and overcommits until the batch changes

"""The KV memory of one instance: an LRU prefix cache of blocks, pins, and reservations.

This is the ground truth the router's index only approximates. A request pins the
blocks of its chain while it uses them (cached blocks it shares are reused, the
others are inserted) and reserves plain tokens (its output, any prompt tail without
block IDs). Unpinned blocks stay cached and are evicted least recently used first
when room is needed; a chain is released from its last block to its first, so a
parent is always more recent than its children and eviction removes leaves first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

__all__ = ["KvMemory"]


class KvMemory:
    """Blocks of ``block_size`` tokens and reserved tokens within ``capacity_tokens``."""

    __slots__ = ("_lru", "_on_evict", "_pins", "block_size", "capacity_tokens", "reserved")

    def __init__(
        self,
        capacity_tokens: int,
        block_size: int,
        on_evict: Callable[[list[int]], None] | None = None,
    ) -> None:
        self.capacity_tokens = capacity_tokens
        self.block_size = block_size
        self.reserved = 0
        self._lru: OrderedDict[int, None] = OrderedDict()  # unpinned cached blocks, LRU first
        self._pins: dict[int, int] = {}  # pinned block -> users
        self._on_evict = on_evict

    @property
    def cached_blocks(self) -> int:
        return len(self._lru) + len(self._pins)

    @property
    def used_tokens(self) -> int:
        """Tokens of memory in use, cached-but-evictable blocks included."""
        return (len(self._lru) + len(self._pins)) * self.block_size + self.reserved

    @property
    def pinned_tokens(self) -> int:
        """Tokens of memory that cannot be evicted (requests in flight)."""
        return len(self._pins) * self.block_size + self.reserved

    def holds(self, block: int) -> bool:
        return block in self._pins or block in self._lru

    def leading_blocks(self, chain: Sequence[int]) -> int:
        """How many leading blocks of ``chain`` are cached (pinned or not)."""
        pins, lru = self._pins, self._lru
        n = 0
        for block in chain:
            if block in pins or block in lru:
                n += 1
            else:
                break
        return n

    def fits(self, chain: Sequence[int], extra_tokens: int) -> bool:
        """Whether pinning ``chain`` and reserving ``extra_tokens`` fits once unpinned
        blocks are evicted."""
        pins = self._pins
        new_pins = sum(1 for block in chain if block not in pins)
        need = (len(pins) + new_pins) * self.block_size + self.reserved + extra_tokens
        return need <= self.capacity_tokens

    def acquire(self, chain: Sequence[int], extra_tokens: int) -> int | None:
        """Pin ``chain`` (inserting missing blocks) and reserve ``extra_tokens``.

        Returns the number of leading blocks that were already cached, or None (and
        changes nothing) when the memory cannot hold it even after eviction.
        """
        pins, lru = self._pins, self._lru
        new_pins = hits = 0
        leading = True
        for block in chain:  # one pass for both the room check and the leading hits
            if block in pins:
                hits += leading
            else:
                new_pins += 1
                if leading:
                    if block in lru:
                        hits += 1
                    else:
                        leading = False
        need = (len(pins) + new_pins) * self.block_size + self.reserved + extra_tokens
        if need > self.capacity_tokens:
            return None
        for block in chain:
            count = pins.get(block)
            if count is not None:
                pins[block] = count + 1
            else:
                lru.pop(block, None)
                pins[block] = 1
        self.reserved += extra_tokens
        if (len(lru) + len(pins)) * self.block_size + self.reserved > self.capacity_tokens:
            self._evict()
        return hits

    def release(self, chain: Sequence[int], extra_tokens: int) -> None:
        """Unpin ``chain`` (it stays cached, most recent) and free ``extra_tokens``."""
        pins, lru = self._pins, self._lru
        for block in reversed(chain):
            count = pins[block] - 1
            if count:
                pins[block] = count
            else:
                del pins[block]
                lru[block] = None
        self.reserved -= extra_tokens

    def _evict(self) -> None:
        lru = self._lru
        excess = self.used_tokens - self.capacity_tokens
        if excess <= 0:
            return
        evicted: list[int] = []
        while excess > 0 and lru:
            block, _ = lru.popitem(last=False)
            evicted.append(block)
            excess -= self.block_size
        if evicted and self._on_evict is not None:
            self._on_evict(evicted)

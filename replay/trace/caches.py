"""Global prefix caches for trace statistics: unbounded, and LRU of a fixed block capacity.

Both answer one question per request, in arrival order: how many leading blocks of
this request were already cached? Then they cache the request's blocks. The caches
hold block IDs only (the IDs are prefix-chained, so an ID stands for its prefix).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["LruPrefixCache", "UnboundedPrefixCache"]


def _leading(ids: Sequence[int], cached: set[int] | OrderedDict[int, None]) -> int:
    hits = 0
    for block_id in ids:
        if block_id not in cached:
            break
        hits += 1
    return hits


class UnboundedPrefixCache:
    """A cache that never evicts: every block ever seen stays."""

    def __init__(self) -> None:
        self._blocks: set[int] = set()

    def __len__(self) -> int:
        return len(self._blocks)

    def visit(self, ids: Sequence[int]) -> int:
        """Count the leading cached blocks of ``ids``, then cache all of them."""
        hits = _leading(ids, self._blocks)
        self._blocks.update(ids)
        return hits


class LruPrefixCache:
    """A cache of at most ``capacity`` blocks, evicting the least recently used.

    After the leading hits are counted, the request's blocks are touched or inserted
    first to last, so within one request the first block is the least recent.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be non-negative, got {capacity}")
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def visit(self, ids: Sequence[int]) -> int:
        """Count the leading cached blocks of ``ids``, then touch or insert all of them."""
        blocks = self._blocks
        hits = _leading(ids, blocks)
        if self.capacity == 0:
            return hits
        touch = blocks.move_to_end
        for block_id in ids:
            if block_id in blocks:
                touch(block_id)
            else:
                blocks[block_id] = None
        excess = len(blocks) - self.capacity
        for _ in range(max(excess, 0)):
            blocks.popitem(last=False)
        return hits

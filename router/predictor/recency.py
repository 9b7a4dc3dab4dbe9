"""How many blocks an instance touched after a given one: the reuse distance of an LRU.

An LRU cache of C blocks still holds a block as long as fewer than C other blocks were
touched (stored, or hit again) after it. ``TouchOrder`` answers "how many live blocks
were touched after stamp s" in O(log n): every store of a chain takes a new stamp, and a
Fenwick tree over stamps sums the live blocks each stamp still holds (a block touched
again moves to the newer stamp). When the stamps run out, those no longer holding any
block are dropped and the rest renumbered in order (``new_stamp`` returns the mapping),
so memory follows the number of live blocks, not the number of stores.
"""

from __future__ import annotations

__all__ = ["TouchOrder"]

_MIN_SIZE = 1024


class TouchOrder:
    """Live blocks per stamp, summed by a Fenwick tree."""

    __slots__ = ("_counts", "_tree", "live", "next_stamp")

    def __init__(self, size: int = _MIN_SIZE) -> None:
        self._counts: list[int] = [0] * max(size, 1)
        self._tree: list[int] = [0] * (len(self._counts) + 1)
        self.live = 0  # live blocks over all stamps
        self.next_stamp = 0

    def _rebuild(self, size: int) -> None:
        counts = self._counts + [0] * (size - len(self._counts))
        tree = [0] * (size + 1)
        for i, n in enumerate(counts, 1):  # linear build: each node passes its sum up once
            tree[i] += n
            parent = i + (i & -i)
            if parent <= size:
                tree[parent] += tree[i]
        self._counts, self._tree = counts, tree

    def new_stamp(self) -> tuple[int, dict[int, int] | None]:
        """A stamp newer than every earlier one, and the renumbering of the earlier stamps
        when it had to compact them (``None`` when nothing was renumbered)."""
        mapping: dict[int, int] | None = None
        size = len(self._counts)
        if self.next_stamp >= size:
            used = [s for s, n in enumerate(self._counts) if n]
            if len(used) <= size // 2:
                mapping = {old: new for new, old in enumerate(used)}
                self._counts = [self._counts[s] for s in used] + [0] * (size - len(used))
                self.next_stamp = len(used)
                self._rebuild(size)
            else:
                self._rebuild(2 * size)
        stamp = self.next_stamp
        self.next_stamp += 1
        return stamp, mapping

    def add(self, stamp: int, n: int) -> None:
        """``n`` more (or, negative, fewer) live blocks at ``stamp``."""
        if n == 0:
            return
        self._counts[stamp] += n
        self.live += n
        tree, size = self._tree, len(self._counts)
        i = stamp + 1
        while i <= size:
            tree[i] += n
            i += i & -i

    def count(self, stamp: int) -> int:
        """Live blocks at ``stamp``."""
        return self._counts[stamp]

    def newer_than(self, stamp: int) -> int:
        """Live blocks touched after ``stamp`` (at a later stamp)."""
        total, tree, i = 0, self._tree, stamp + 1
        while i > 0:
            total += tree[i]
            i -= i & -i
        return self.live - total

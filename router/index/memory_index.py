"""The embedded prefix index: per-instance LRU (and optional TTL), matched by bisection.

Layout. Each registered instance gets a *slot* (a small integer, reused after
``unregister``); per block the index keeps the set of instances holding it as a
Python ``int`` bitmask over slots, and per instance a dict block -> last-touch time
in least-recently-used-first order (the LRU and the TTL queue at once, since a clock
only moves forward). A plain dict keeps its keys in insertion order, so a touched
block is popped and inserted again; that costs less than an ``OrderedDict``'s move,
and its other operations about half.

Match. Holding is monotone along a chain (see :mod:`router.index.base`), so for a
set of candidate instances whose depth is known to lie in ``[lo, hi]`` one probe of
block ``mid`` splits them into holders (depth in ``[mid + 1, hi]``) and
non-holders (depth in ``[lo, mid]``) with two mask operations; recursing costs
about (number of distinct depths) x log2(chain length) probes, whatever the
number of instances. Probing the first and the last block up front settles the
common "holds nothing" and "holds everything" cases in two probes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from itertools import islice

from policies.tiers import Tier
from router.index.base import Clock, IndexedInstance, UnknownInstanceError, unknown_instances

__all__ = ["MemoryPrefixIndex"]


class _Entry:
    """One registered instance: its spec, its slot bit and its LRU of blocks."""

    __slots__ = ("bit", "blocks", "spec")

    def __init__(self, spec: IndexedInstance, bit: int) -> None:
        self.spec = spec
        self.bit = bit
        self.blocks: dict[int, float] = {}  # oldest touch first


class MemoryPrefixIndex:
    """In-process :class:`~router.index.base.PrefixIndex` (not thread-safe; one owner)."""

    def __init__(
        self,
        default_capacity_blocks: int | None = None,
        ttl_s: float | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        if default_capacity_blocks is not None and default_capacity_blocks <= 0:
            raise ValueError(
                f"default_capacity_blocks must be positive, got {default_capacity_blocks}"
            )
        if ttl_s is not None and ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        self._default_capacity = default_capacity_blocks
        self._ttl = ttl_s
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._by_slot: dict[int, _Entry] = {}  # slot number -> entry
        self._free_slots: list[int] = []
        self._next_slot = 0
        self._holders: dict[int, int] = {}  # block -> bitmask of slots holding it
        self._all_bits = 0  # bitmask of every registered instance's slot

    # ------------------------------------------------------------------ instances

    def register(self, instance: IndexedInstance) -> None:
        if instance.capacity_blocks is not None and instance.capacity_blocks <= 0:
            raise ValueError(
                f"capacity_blocks of {instance.instance_id!r} must be positive, "
                f"got {instance.capacity_blocks}"
            )
        entry = self._entries.get(instance.instance_id)
        if entry is not None:
            entry.spec = instance
            self._expire(entry, self._clock())
            self._evict(entry)  # the capacity may have shrunk
            return
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            slot = self._next_slot
            self._next_slot += 1
        entry = _Entry(instance, 1 << slot)
        self._entries[instance.instance_id] = entry
        self._by_slot[slot] = entry
        self._all_bits |= entry.bit

    def unregister(self, instance_id: str) -> None:
        """Forget the instance and its blocks; an unknown id is a no-op (idempotent)."""
        entry = self._entries.pop(instance_id, None)
        if entry is None:
            return
        self._drop_all(entry)
        slot = entry.bit.bit_length() - 1
        del self._by_slot[slot]
        self._all_bits &= ~entry.bit
        self._free_slots.append(slot)

    def instances(self) -> list[IndexedInstance]:
        return [self._entries[i].spec for i in sorted(self._entries)]

    # ------------------------------------------------------------------ updates

    def store(self, instance_id: str, chain: Sequence[int]) -> None:
        entry = self._entry(instance_id)
        now = self._clock()
        blocks = entry.blocks
        holders = self._holders
        bit = entry.bit
        pop = blocks.pop
        # Last block first: every parent ends up more recent than its children.
        for block in reversed(chain):
            if pop(block, None) is None:  # new here (touch times are never None)
                holders[block] = holders.get(block, 0) | bit
            blocks[block] = now
        if self._ttl is not None:
            self._expire(entry, now)
        self._evict(entry)

    def store_many(self, items: Sequence[tuple[str, Sequence[int]]]) -> None:
        unknown = []
        for instance_id, chain in items:
            if instance_id in self._entries:
                self.store(instance_id, chain)
            else:
                unknown.append(instance_id)
        if unknown:
            raise unknown_instances(unknown)

    def remove(self, instance_id: str, blocks: Sequence[int]) -> None:
        entry = self._entry(instance_id)
        held = entry.blocks
        holders = self._holders
        keep = ~entry.bit
        for block in blocks:
            if held.pop(block, None) is not None:
                mask = holders[block] & keep
                if mask:
                    holders[block] = mask
                else:
                    del holders[block]

    def clear(self, instance_id: str) -> None:
        self._drop_all(self._entry(instance_id))

    # ------------------------------------------------------------------ queries

    def num_blocks(self, instance_id: str) -> int:
        entry = self._entry(instance_id)
        self._expire(entry, self._clock())
        return len(entry.blocks)

    def match(
        self, chain: Sequence[int], *, tier: Tier | None = None, datacenter: str | None = None
    ) -> dict[str, int]:
        result: dict[str, int]
        if tier is None and datacenter is None and self._ttl is None:  # every instance
            result = dict.fromkeys(self._entries, 0)
            candidates = self._all_bits
        else:
            now = self._clock() if self._ttl is not None else 0.0
            result = {}
            candidates = 0
            for instance_id, entry in self._entries.items():
                spec = entry.spec
                if (tier is None or spec.tier == tier) and (
                    datacenter is None or spec.datacenter == datacenter
                ):
                    if self._ttl is not None:
                        self._expire(entry, now)
                    result[instance_id] = 0
                    candidates |= entry.bit
        n = len(chain)
        if not candidates or n == 0:
            return result
        holders = self._holders

        # Depth of every candidate in ``mask`` is known to lie in [lo, hi].
        first = holders.get(chain[0], 0) & candidates
        if not first:
            return result
        last = holders.get(chain[-1], 0) & first if n > 1 else first
        if last:
            self._assign(result, last, n)
        rest = first & ~last
        stack: list[tuple[int, int, int]] = [(1, n - 1, rest)] if rest else []
        while stack:
            lo, hi, mask = stack.pop()
            if lo >= hi:
                self._assign(result, mask, lo)
                continue
            mid = (lo + hi) >> 1
            inside = holders.get(chain[mid], 0) & mask
            if inside:
                stack.append((mid + 1, hi, inside))
            outside = mask & ~inside
            if outside:
                stack.append((lo, mid, outside))
        return result

    # ------------------------------------------------------------------ internals

    def _assign(self, result: dict[str, int], mask: int, depth: int) -> None:
        by_slot = self._by_slot
        while mask:
            low = mask & -mask
            result[by_slot[low.bit_length() - 1].spec.instance_id] = depth
            mask ^= low

    def _entry(self, instance_id: str) -> _Entry:
        entry = self._entries.get(instance_id)
        if entry is None:
            raise UnknownInstanceError(f"unknown instance {instance_id!r}")
        return entry

    def _capacity(self, entry: _Entry) -> int | None:
        cap = entry.spec.capacity_blocks
        return self._default_capacity if cap is None else cap

    def _evict(self, entry: _Entry) -> None:
        cap = self._capacity(entry)
        if cap is None:
            return
        blocks = entry.blocks
        excess = len(blocks) - cap
        if excess <= 0:
            return
        holders = self._holders
        keep = ~entry.bit
        for block in list(islice(blocks, excess)):  # the least recently used
            del blocks[block]
            mask = holders[block] & keep
            if mask:
                holders[block] = mask
            else:
                del holders[block]

    def _expire(self, entry: _Entry, now: float) -> None:
        """Drop the blocks not touched for ttl_s seconds (they sit at the LRU front)."""
        ttl = self._ttl
        if ttl is None:
            return
        blocks = entry.blocks
        expired: list[int] = []
        for block, touched in blocks.items():  # one pass from the front
            if now - touched < ttl:
                break
            expired.append(block)
        bit = entry.bit
        for block in expired:
            del blocks[block]
            self._unhold(block, bit)

    def _drop_all(self, entry: _Entry) -> None:
        bit = entry.bit
        for block in entry.blocks:
            self._unhold(block, bit)
        entry.blocks.clear()

    def _unhold(self, block: int, bit: int) -> None:
        mask = self._holders[block] & ~bit
        if mask:
            self._holders[block] = mask
        else:
            del self._holders[block]

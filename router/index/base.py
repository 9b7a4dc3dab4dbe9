"""The prefix-index contract shared by the in-memory and the Redis implementations."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from policies.tiers import Tier

__all__ = ["Clock", "IndexedInstance", "PrefixIndex", "UnknownInstanceError", "unknown_instances"]

Clock = Callable[[], float]
"""Seconds, injected so that TTLs work in simulated time as well as wall time."""


class UnknownInstanceError(KeyError):
    """An operation named an instance that was never registered with the index."""


def unknown_instances(instance_ids: Sequence[str]) -> UnknownInstanceError:
    """The error naming the unregistered instances of a batched update (first seen first)."""
    unique = list(dict.fromkeys(instance_ids))
    if len(unique) == 1:
        return UnknownInstanceError(f"unknown instance {unique[0]!r}")
    return UnknownInstanceError("unknown instances " + ", ".join(map(repr, unique)))


@dataclass(frozen=True, slots=True)
class IndexedInstance:
    """An engine instance as the index knows it."""

    instance_id: str
    tier: Tier
    datacenter: str
    capacity_blocks: int | None = None  # None: the index's default capacity


class PrefixIndex(Protocol):
    """Which leading blocks of a chain each registered instance holds.

    Invariant both implementations keep: holding is monotone along a chain (an
    instance that holds block i holds every block before it) as long as blocks are
    stored as whole chains and removed leaf first, as engines do. ``store`` touches
    a chain from its last block back to its first, so LRU eviction and TTL expiry
    always remove children before their parents, and ``match`` may bisect instead of
    walking the whole chain.
    """

    def register(self, instance: IndexedInstance) -> None:
        """Add an instance (or update its tier, datacenter, capacity)."""

    def unregister(self, instance_id: str) -> None:
        """Forget an instance and every block it held."""

    def instances(self) -> list[IndexedInstance]:
        """Registered instances, sorted by id."""

    def store(self, instance_id: str, chain: Sequence[int]) -> None:
        """Record that the instance holds the chain (first block first); LRU-evict past capacity."""

    def store_many(self, items: Sequence[tuple[str, Sequence[int]]]) -> None:
        """``store`` each (instance, chain) in order, as one update (Redis: one round trip).

        The outcome is the one of calling ``store`` for each item in turn: the same LRU
        order, TTL and capacity evictions. The chains of an unregistered instance are
        skipped and the others stored all the same, then UnknownInstanceError names the
        unregistered ones. Block ids the index cannot take (a ValueError) are refused
        before anything is stored.
        """

    def remove(self, instance_id: str, blocks: Sequence[int]) -> None:
        """Record that the instance no longer holds these blocks (unknown blocks are ignored)."""

    def clear(self, instance_id: str) -> None:
        """Record that the instance holds nothing (an engine restart, a cache reset)."""

    def match(
        self, chain: Sequence[int], *, tier: Tier | None = None, datacenter: str | None = None
    ) -> dict[str, int]:
        """Number of leading blocks of ``chain`` each instance holds (0 included), filtered."""

    def num_blocks(self, instance_id: str) -> int:
        """How many blocks the index currently records for the instance."""

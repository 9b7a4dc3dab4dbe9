"""The pieces outage recovery keeps beside a shared index: the local mirror, the shared
index's optional abilities, the counts of what recovery did, and a rebuild's plan."""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from router.index.base import IndexedInstance
from router.index.memory_index import MemoryPrefixIndex

__all__ = [
    "Blocks",
    "Generational",
    "Mirror",
    "Rebuild",
    "RecoveryStats",
    "Restorable",
    "instances_of",
]


@runtime_checkable
class Generational(Protocol):
    """A shared index naming its contents with a token that changes when they are lost."""

    def generation(self) -> str: ...


@runtime_checkable
class Restorable(Protocol):
    """A shared index that takes instances and chains back in one round trip."""

    def restore(
        self, instances: Sequence[IndexedInstance], chains: Sequence[tuple[str, Sequence[int]]]
    ) -> None: ...


def instances_of(name: str, args: tuple[Any, ...]) -> list[str]:
    """The instances an update names (a batched store: every item's)."""
    if name == "store_many":
        return list(dict.fromkeys(iid for iid, _ in args[0]))
    return [args[0]]


class Mirror(MemoryPrefixIndex):
    """The local index, which can also list an instance's blocks in LRU order."""

    def lru(self, instance_id: str) -> list[int]:
        """The instance's blocks, least recently used first (children before parents)."""
        entry = self._entries.get(instance_id)
        return [] if entry is None else list(entry.blocks)

    def held(self, instance_id: str) -> Container[int]:
        entry = self._entries.get(instance_id)
        return () if entry is None else entry.blocks.keys()


@dataclass
class RecoveryStats:
    """What the wrapper had to do to keep the shared index in step with the mirror."""

    outages: int = 0  # times the shared index became unreachable
    rebuilds: int = 0  # times it was rebuilt from the mirror (lost state, or a log that broke)
    replayed_updates: int = 0  # queued updates applied once it answered again
    superseded_updates: int = 0  # queued updates dropped because a rebuild wrote the mirror
    overflowed_updates: int = 0  # updates pushed out of a full log (a rebuild follows)
    failed_updates: int = 0  # queued updates the shared index refused (a rebuild follows)
    rebuilt_blocks: int = 0  # blocks written back from the mirror


@dataclass
class Blocks:
    """One instance's blocks to write back, oldest first, and how many are written."""

    instance_id: str
    blocks: list[int]
    done: int = 0


@dataclass
class Rebuild:
    """Instances registered again whose blocks are still to be written back."""

    todo: deque[Blocks] = field(default_factory=deque)
    ids: set[str] = field(default_factory=set)

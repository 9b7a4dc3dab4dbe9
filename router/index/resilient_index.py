"""A shared index that keeps deciding through a Redis outage or an empty restart, then repairs it.

Every update goes to a local in-memory mirror and to the shared index. The mirror is
this replica's own view: the instances it registered, what it routed and the KV events
it ingested. The wrapper is in one of three states:

- *up*: the shared index answers and holds this replica's state;
- *down*: the shared index is unreachable. Matches are answered from the mirror,
  updates queue in a bounded log, and the shared index is tried again every
  ``retry_after_s``;
- *recovering*: the shared index answers again and is being brought up to date, a
  bounded amount of work per call (``step_s``), while the mirror answers: either the
  queued updates are replayed, or, when the shared index lost this replica's state,
  it is rebuilt from the mirror.

The shared index has lost the state when Redis restarted without its data or was
flushed. That is noticed by an instance the mirror knows being unknown to it (an
UnknownInstanceError, a match or an instance list without it) and, with a primary
that has one (``RedisContents.generation``), by the token naming the shared
index's contents changing; the token is read when the shared index comes back, every
``verify_every_s`` and by :meth:`ResilientIndex.check`. A rebuild re-registers the
instances and writes back each instance's blocks oldest first, in pipelined batches,
so the shared LRU keeps the mirror's order (parents more recent than their children).
It supersedes the queued updates: the mirror already holds them. An update that
cannot be replayed never blocks the log: the shared index is rebuilt instead. Every
case is counted in :attr:`ResilientIndex.stats`.

``degraded`` is true unless the state is *up*; ``on_state_change`` hears every change.

The wrapper is a facade over two parts, one job each: ``OutageRecovery``
(``router.index.outage``: the mirror, the log and its replay, the rebuild) and
``ReplicaHandover`` (``router.index.handover``: KV events another replica writes, kept
for a take-over).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypedDict, Unpack

from policies.tiers import Tier
from router.index.base import Clock, IndexedInstance, PrefixIndex, UnknownInstanceError
from router.index.handover import ReplicaHandover
from router.index.mirror import Mirror, RecoveryStats
from router.index.outage import OutageRecovery

__all__ = ["RecoveryOptions", "RecoveryStats", "ResilientIndex"]


class RecoveryOptions(TypedDict, total=False):
    """The keyword-only settings of ``OutageRecovery``, which ``ResilientIndex`` passes on."""

    default_capacity_blocks: int | None
    ttl_s: float | None
    retry_after_s: float
    verify_every_s: float
    step_s: float
    batch_blocks: int
    max_pending: int
    clock: Clock
    timer: Clock
    on_state_change: Callable[[bool], None] | None


class ResilientIndex:
    """PrefixIndex over a shared ``primary`` with a local mirror for outages and restarts."""

    def __init__(self, primary: PrefixIndex, **options: Unpack[RecoveryOptions]) -> None:
        """``options``: the mirror's and the recovery's settings (``OutageRecovery``)."""
        self.recovery = OutageRecovery(primary, **options)
        self.handover = ReplicaHandover(self.recovery.send, self.recovery.clock)
        self.primary = primary
        self.local: Mirror = self.recovery.local
        self.stats: RecoveryStats = self.recovery.stats

    # -- state ------------------------------------------------------------------------
    @property
    def degraded(self) -> bool:
        """True while matches are answered from the mirror (down or recovering)."""
        return self.recovery.degraded

    @degraded.setter
    def degraded(self, value: bool) -> None:
        """Force the state: True acts as an outage, False as the shared index answering."""
        self.recovery.degraded = value

    @property
    def dropped_updates(self) -> int:
        """Queued updates that never reached the shared index (a rebuild wrote the mirror)."""
        return self.stats.superseded_updates

    @property
    def state(self) -> str:
        """``up``, ``down`` or ``recovering``."""
        return self.recovery.state

    def check(self) -> bool:
        """Probe the shared index now and take a step of recovery; returns ``degraded``
        (``OutageRecovery.check``)."""
        return self.recovery.check()

    def _forward(self, name: str, args: tuple[Any, ...]) -> None:
        """An update the mirror has: kept for a take-over when another replica writes it,
        else sent to the shared index (or queued while it is down)."""
        if not self.handover.withheld(name, args):
            self.recovery.send(name, args)

    # -- the contract -------------------------------------------------------------------
    def register(self, instance: IndexedInstance) -> None:
        self.recovery.remember(instance)
        self._forward("register", (instance,))

    def unregister(self, instance_id: str) -> None:
        self.recovery.forget(instance_id)
        self._forward("unregister", (instance_id,))

    def instances(self) -> list[IndexedInstance]:
        recovery = self.recovery
        return recovery.read(
            self.primary.instances,
            self.local.instances,
            lambda found: recovery.missing((i.instance_id for i in found), None, None),
        )

    def store(self, instance_id: str, chain: Sequence[int]) -> None:
        chain = tuple(chain)
        self.local.store(instance_id, chain)
        self._forward("store", (instance_id, chain))

    def store_many(self, items: Sequence[tuple[str, Sequence[int]]]) -> None:
        """Stored in the mirror and sent to the shared index as one update (queued as one
        entry per chain while it is down); an unregistered instance's chains go to
        neither, and UnknownInstanceError names it once the others are stored."""
        items = tuple((iid, tuple(chain)) for iid, chain in items)
        try:
            self.local.store_many(items)
        except UnknownInstanceError:
            known = tuple(item for item in items if self.recovery.knows(item[0]))
            if known:
                self._forward("store_many", (known,))
            raise
        if items:
            self._forward("store_many", (items,))

    def remove(self, instance_id: str, blocks: Sequence[int]) -> None:
        blocks = tuple(blocks)
        self.local.remove(instance_id, blocks)
        self._forward("remove", (instance_id, blocks))

    def clear(self, instance_id: str) -> None:
        self.local.clear(instance_id)
        self._forward("clear", (instance_id,))

    def match(
        self, chain: Sequence[int], *, tier: Tier | None = None, datacenter: str | None = None
    ) -> dict[str, int]:
        recovery = self.recovery
        return recovery.read(
            lambda: self.primary.match(chain, tier=tier, datacenter=datacenter),
            lambda: self.local.match(chain, tier=tier, datacenter=datacenter),
            lambda found: recovery.missing(found, tier, datacenter),
        )

    def num_blocks(self, instance_id: str) -> int:
        return self.recovery.read(
            lambda: self.primary.num_blocks(instance_id),
            lambda: self.local.num_blocks(instance_id),
            unknown=instance_id,
        )

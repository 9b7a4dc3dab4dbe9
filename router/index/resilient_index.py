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
that has one (``RedisPrefixIndex.generation``), by the token naming the shared
index's contents changing; the token is read when the shared index comes back, every
``verify_every_s`` and by :meth:`ResilientIndex.check`. A rebuild re-registers the
instances and writes back each instance's blocks oldest first, in pipelined batches,
so the shared LRU keeps the mirror's order (parents more recent than their children).
It supersedes the queued updates: the mirror already holds them. An update that
cannot be replayed never blocks the log: the shared index is rebuilt instead. Every
case is counted in :attr:`ResilientIndex.stats`.

``degraded`` is true unless the state is *up*; ``on_state_change`` hears every change.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

from redis.exceptions import RedisError

from policies.tiers import Tier
from router.errors import UserError
from router.index.base import Clock, IndexedInstance, PrefixIndex, UnknownInstanceError
from router.index.memory_index import MemoryPrefixIndex

__all__ = ["RecoveryStats", "ResilientIndex"]

_OUTAGE = (RedisError, UserError, OSError)
_BLOCK_LIMIT = 1 << 64  # the Redis index takes block ids in [0, 2**64)
_HELD_MAX = 100_000  # KV-event updates kept per instance for a take-over, at most
T = TypeVar("T")


@runtime_checkable
class _Generational(Protocol):
    def generation(self) -> str: ...


@runtime_checkable
class _Restorable(Protocol):
    def restore(
        self, instances: Sequence[IndexedInstance], chains: Sequence[tuple[str, Sequence[int]]]
    ) -> None: ...


def _instances_of(name: str, args: tuple[Any, ...]) -> list[str]:
    """The instances an update names (a batched store: every item's)."""
    if name == "store_many":
        return list(dict.fromkeys(iid for iid, _ in args[0]))
    return [args[0]]


class _Mirror(MemoryPrefixIndex):
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
class _Blocks:
    """One instance's blocks to write back, oldest first, and how many are written."""

    instance_id: str
    blocks: list[int]
    done: int = 0


@dataclass
class _Rebuild:
    """Instances registered again whose blocks are still to be written back."""

    todo: deque[_Blocks] = field(default_factory=deque)
    ids: set[str] = field(default_factory=set)


class ResilientIndex:
    """PrefixIndex over a shared ``primary`` with a local mirror for outages and restarts."""

    def __init__(  # noqa: PLR0913 -- outage handling settings, keyword-only with defaults
        self,
        primary: PrefixIndex,
        *,
        default_capacity_blocks: int | None = None,
        ttl_s: float | None = None,
        retry_after_s: float = 1.0,
        verify_every_s: float = 1.0,
        step_s: float = 0.05,
        batch_blocks: int = 2048,
        max_pending: int = 100_000,
        clock: Clock = time.monotonic,
        timer: Clock = time.perf_counter,
        on_state_change: Callable[[bool], None] | None = None,
    ) -> None:
        """``clock`` times retries and verification; ``timer`` (a real clock, also when
        ``clock`` is simulated) bounds the work one call spends on recovery to about
        ``step_s`` plus one batch of ``batch_blocks`` blocks."""
        if batch_blocks <= 0:
            raise ValueError(f"batch_blocks must be positive, got {batch_blocks}")
        self.primary = primary
        self._generational = isinstance(primary, _Generational)
        self._restorable = isinstance(primary, _Restorable)
        self.local = _Mirror(
            default_capacity_blocks=default_capacity_blocks, ttl_s=ttl_s, clock=clock
        )
        self.on_state_change = on_state_change
        self.stats = RecoveryStats()
        self._retry_after = retry_after_s
        self._verify_every = verify_every_s
        self._step_s = step_s
        self._batch = batch_blocks
        self._clock = clock
        self._timer = timer
        self._known: dict[str, IndexedInstance] = {}
        self._forgotten: set[str] = set()  # unregistered while only a rebuild could tell
        self._pending: deque[tuple[str, tuple[Any, ...]]] = deque(maxlen=max_pending)
        self._down = False
        self._next_try = 0.0
        self._next_verify = 0.0
        self._generation: str | None = None
        self._must_rebuild = False  # the shared index lost (or may have lost) our state
        self._rebuild: _Rebuild | None = None
        self._reported = False
        # KV events another replica writes to the shared index (see kv_events_of)
        self.kv_writer: Callable[[str], bool] | None = None
        self.hold_s = 10.0
        self._ingesting: str | None = None
        self._held: dict[str, deque[tuple[float, str, tuple[Any, ...]]]] = {}
        self._started = self._clock()  # KV events are kept from then on (kv_events_of)

    # -- state ------------------------------------------------------------------------
    @property
    def degraded(self) -> bool:
        """True while matches are answered from the mirror (down or recovering)."""
        return self._down or bool(self._pending) or self._rebuild is not None

    @degraded.setter
    def degraded(self, value: bool) -> None:
        """Force the state: True acts as an outage, False as the shared index answering."""
        if value:
            self._go_down()
        else:
            self._down = False
        self._publish()

    @property
    def dropped_updates(self) -> int:
        """Queued updates that never reached the shared index (a rebuild wrote the mirror)."""
        return self.stats.superseded_updates

    @property
    def state(self) -> str:
        """``up``, ``down`` or ``recovering``."""
        if self._down:
            return "down"
        return "recovering" if self.degraded else "up"

    def check(self) -> bool:
        """Probe the shared index now (when up: a restart without data is noticed at
        once; when down: only once the retry delay has passed) and take a step of
        recovery; returns ``degraded``. One round trip when up, bounded when recovering."""
        if not self.degraded:
            self._next_verify = 0.0
        self._ready()
        self._publish()
        return self.degraded

    def _publish(self) -> None:
        degraded = self.degraded
        if degraded != self._reported:
            self._reported = degraded
            if self.on_state_change is not None:
                self.on_state_change(degraded)

    def _go_down(self) -> None:
        if not self._down:
            self.stats.outages += 1
        self._down = True
        self._next_try = self._clock() + self._retry_after
        if self._rebuild is not None:  # what it wrote may be gone again: start over then
            self._rebuild = None
            self._must_rebuild = True

    # -- catching up --------------------------------------------------------------------
    def _ready(self) -> bool:
        """True when the shared index may answer now; otherwise the mirror answers. Tries
        the shared index again once the retry delay has passed, verifies its generation
        when due, and does one bounded step of replay or rebuild."""
        try:
            if self._down:
                if self._clock() < self._next_try:
                    return False
                self._resume()
            elif self._clock() >= self._next_verify:
                self._verify()
            if self._rebuild is not None or self._pending:
                self._step()
        except _OUTAGE:
            self._go_down()
            return False
        return not self.degraded

    def _fetch_generation(self) -> str | None:
        """The shared index's generation token (a liveness probe too); None without one."""
        if not self._generational:
            return None
        token = cast(_Generational, self.primary).generation()
        self._next_verify = self._clock() + self._verify_every
        return token

    def _replaced(self, token: str | None) -> bool:
        """Whether the generation token says the shared index's contents were replaced."""
        old, self._generation = self._generation, token
        return token is not None and old is not None and token != old

    def _resume(self) -> None:
        """The retry delay passed: probe; replay the log, or rebuild when state was lost."""
        replaced = self._replaced(self._fetch_generation())
        self._down = False
        if replaced or self._must_rebuild:
            self._start_rebuild(None, fresh=replaced)

    def _verify(self) -> None:
        if self._replaced(self._fetch_generation()):
            self._start_rebuild(None, fresh=True)

    def _lost(self, missing: Iterable[str]) -> None:
        """The shared index does not know instances the mirror has: write them again (all
        of them when its generation changed). An outage meanwhile only marks one."""
        try:
            replaced = self._replaced(self._fetch_generation())
            full = replaced or self._must_rebuild
            self._start_rebuild(None if full else set(missing), fresh=replaced)
        except _OUTAGE:
            self._go_down()
            self._must_rebuild = True

    def _start_rebuild(self, only: set[str] | None, *, fresh: bool) -> None:
        """Register the instances again (all, or ``only``) and plan writing back their
        blocks. A full rebuild (``only`` None) supersedes the log, since the mirror holds
        every queued update; unless the shared index is ``fresh`` (it lost everything) it
        first clears each instance there, so that removals the log lost do not linger,
        and unregisters the instances forgotten meanwhile."""
        if only is None:
            self._must_rebuild = True  # until the instances are registered again
            self._drop_pending()
            self._rebuild = None
            ids = set(self._known)
            if not fresh:
                for iid in sorted(self._forgotten - ids):
                    self.primary.unregister(iid)
            self._forgotten.clear()
        else:
            ids = {iid for iid in only if iid in self._known}
            if self._rebuild is not None:
                ids -= self._rebuild.ids
        instances = [self._known[iid] for iid in sorted(ids)]
        if instances:
            self._write(instances, [])
        if only is None:
            if not fresh:
                for instance in instances:
                    self.primary.clear(instance.instance_id)
            self._must_rebuild = False
        if instances:
            self.stats.rebuilds += 1
            plan = self._rebuild or _Rebuild()
            for instance in instances:
                iid = instance.instance_id
                plan.todo.append(_Blocks(iid, self.local.lru(iid)))
                plan.ids.add(iid)
            self._rebuild = plan

    def _drop_pending(self) -> None:
        """Forget the log (a rebuild writes the mirror instead), keeping who was unregistered."""
        for name, args in self._pending:
            if name == "unregister":
                self._forgotten.add(args[0])
        self.stats.superseded_updates += len(self._pending)
        self._pending.clear()

    def _write(
        self, instances: Sequence[IndexedInstance], chains: Sequence[tuple[str, Sequence[int]]]
    ) -> None:
        if self._restorable:
            cast(_Restorable, self.primary).restore(instances, chains)
            return
        for instance in instances:
            self.primary.register(instance)
        if chains:
            self.primary.store_many(chains)

    def _step(self) -> None:
        """About ``step_s`` of recovery: rebuild batches, else replayed updates."""
        deadline = self._timer() + self._step_s
        while self._rebuild is not None:
            self._rebuild_batches()
            if self._timer() >= deadline:
                return
        while self._pending:
            name, args = self._pending[0]
            try:
                getattr(self.primary, name)(*args)
            except _OUTAGE:
                raise
            except Exception:  # an unknown instance, refused arguments: never block the log
                self.stats.failed_updates += 1
                self._pending.popleft()
                self._start_rebuild(None, fresh=False)
                while self._rebuild is not None and self._timer() < deadline:
                    self._rebuild_batches()
                return
            self._pending.popleft()
            self.stats.replayed_updates += 1
            if self._timer() >= deadline:
                return

    def _rebuild_batches(self) -> None:
        """Write back up to four batches of blocks in one pipelined round trip."""
        plan = self._rebuild
        assert plan is not None
        chains: list[tuple[str, Sequence[int]]] = []
        budget = 4 * self._batch
        while plan.todo and budget > 0:
            item = plan.todo[0]
            take = min(self._batch, budget, len(item.blocks) - item.done)
            chunk = item.blocks[item.done : item.done + take]
            item.done += take
            budget -= max(take, 1)
            if item.done >= len(item.blocks):
                plan.todo.popleft()
            if item.instance_id not in self._known:
                continue
            held = self.local.held(item.instance_id)  # blocks removed meanwhile stay out
            kept = [b for b in chunk if b in held and 0 <= b < _BLOCK_LIMIT]
            if kept:
                kept.reverse()  # a chain is stored last block first: the oldest ranks lowest
                chains.append((item.instance_id, kept))
        if chains:
            try:
                self._write([], chains)
            except UnknownInstanceError:  # lost again meanwhile: start over
                self._start_rebuild(None, fresh=self._replaced(self._fetch_generation()))
                return
            self.stats.rebuilt_blocks += sum(len(chain) for _, chain in chains)
        if not plan.todo and self._rebuild is plan:
            self._rebuild = None

    # -- the two paths ------------------------------------------------------------------
    def _forward(self, name: str, args: tuple[Any, ...]) -> None:
        """Send an update the mirror already has to the shared index, or queue it."""
        ingesting, writer = self._ingesting, self.kv_writer
        if ingesting is not None and writer is not None and not writer(ingesting):
            self._hold_back(ingesting, name, args)
            return
        try:
            if self._ready() or (self._rebuild is not None and not self._down):
                # Up, or rebuilding: the instances are registered again, and a block
                # written back later is written oldest first, so the LRU order holds.
                try:
                    getattr(self.primary, name)(*args)
                    return
                except _OUTAGE:
                    self._go_down()
                except UnknownInstanceError:
                    self._lost(_instances_of(name, args))  # the rebuild writes the mirror
                    return
            if self._must_rebuild:
                # a rebuild will write the mirror, which holds this update
                if name == "unregister":
                    self._forgotten.add(args[0])
                return
            entries = [(name, args)]
            if name == "store_many":  # one entry per chain in the log, as stored alone
                entries = [("store", item) for item in args[0]]
            for entry in entries:
                if len(self._pending) == self._pending.maxlen:
                    # the log lost an update: only a rebuild from the mirror is complete now
                    self.stats.overflowed_updates += 1
                    self._drop_pending()
                    self._must_rebuild = True
                    if name == "unregister":
                        self._forgotten.add(args[0])
                    return
                self._pending.append(entry)
        finally:
            self._publish()

    def _read(
        self,
        primary: Callable[[], T],
        local: Callable[[], T],
        missing: Callable[[T], list[str]] = lambda _: [],
        unknown: str | None = None,
    ) -> T:
        """The shared index's answer when it is up and holds our state, else the mirror's.
        ``missing`` names the instances an answer lacks although the mirror has them."""
        try:
            if self._ready():
                try:
                    answer = primary()
                except _OUTAGE:
                    self._go_down()
                except UnknownInstanceError:
                    if unknown is None or unknown not in self._known:
                        raise
                    self._lost([unknown])
                else:
                    lacking = missing(answer)
                    if not lacking:
                        return answer
                    self._lost(lacking)
            return local()
        finally:
            self._publish()

    def _missing(self, ids: Iterable[str], tier: Tier | None, datacenter: str | None) -> list[str]:
        present = set(ids)
        return [
            iid
            for iid, spec in self._known.items()
            if iid not in present
            and (tier is None or spec.tier == tier)
            and (datacenter is None or spec.datacenter == datacenter)
        ]

    # -- KV events several replicas receive ---------------------------------------------
    @contextlib.contextmanager
    def kv_events_of(self, instance_id: str) -> Iterator[None]:
        """Within: the updates are the instance's KV events. Every replica receives them
        and keeps them in its mirror, but only the one ``kv_writer`` names (a lease in
        Redis) writes them to the shared index; the others keep them for ``hold_s``, so
        the replica that takes the instance over writes what the shared index may have
        missed meanwhile (``take_over``)."""
        self._ingesting = instance_id
        try:
            yield
        finally:
            self._ingesting = None

    def _hold_back(self, instance_id: str, name: str, args: tuple[Any, ...]) -> None:
        now = self._clock()
        held = self._held.setdefault(instance_id, deque(maxlen=_HELD_MAX))
        held.append((now, name, args))
        while held and held[0][0] < now - self.hold_s:
            held.popleft()

    def take_over(self, instance_id: str, unwritten_s: float | None = None) -> tuple[int, bool]:
        """This replica now writes the instance's KV events: send the shared index the
        ones it kept from the last ``hold_s``, in order (replaying a stretch of stores,
        removals and clears that the shared index partly has leaves it as the whole
        stretch does).

        ``unwritten_s``: how long nobody wrote them (None: unknown, or never written). When
        that stretch began before what this replica kept (it started since, or kept less
        than ``hold_s``), the shared index may hold blocks the engine evicted meanwhile:
        the instance is cleared there first and written again from what was kept, as after
        a gap. Returns (updates sent or queued, whether the instance was cleared)."""
        held = self._held.pop(instance_id, None) or deque()
        now = self._clock()
        since = now - self.hold_s
        complete_since = max(since, self._started)
        if held and held.maxlen is not None and len(held) == held.maxlen:
            complete_since = max(complete_since, held[0][0])
        cleared = unwritten_s is not None and now - unwritten_s < complete_since
        if cleared:
            self._forward("clear", (instance_id,))
        sent = 0
        for at, name, args in held:
            if at >= since:
                self._forward(name, args)
                sent += 1
        return sent, cleared

    def forget_held(self, instance_id: str) -> None:
        """Drop the updates kept for an instance (it was removed)."""
        self._held.pop(instance_id, None)

    # -- the contract -------------------------------------------------------------------
    def register(self, instance: IndexedInstance) -> None:
        self.local.register(instance)
        self._known[instance.instance_id] = instance
        self._forgotten.discard(instance.instance_id)
        self._forward("register", (instance,))

    def unregister(self, instance_id: str) -> None:
        self.local.unregister(instance_id)
        self._known.pop(instance_id, None)
        self._forward("unregister", (instance_id,))

    def instances(self) -> list[IndexedInstance]:
        return self._read(
            self.primary.instances,
            self.local.instances,
            lambda found: self._missing((i.instance_id for i in found), None, None),
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
            known = tuple(item for item in items if item[0] in self._known)
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
        return self._read(
            lambda: self.primary.match(chain, tier=tier, datacenter=datacenter),
            lambda: self.local.match(chain, tier=tier, datacenter=datacenter),
            lambda found: self._missing(found, tier, datacenter),
        )

    def num_blocks(self, instance_id: str) -> int:
        return self._read(
            lambda: self.primary.num_blocks(instance_id),
            lambda: self.local.num_blocks(instance_id),
            unknown=instance_id,
        )

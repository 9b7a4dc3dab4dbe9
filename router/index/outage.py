"""Outage recovery of a shared index: the local mirror answers while the shared index is
down or being repaired, updates queue in a bounded log and are replayed, and a shared
index that lost this replica's state is rebuilt from the mirror.

The states (*up*, *down*, *recovering*), how a lost state is noticed and how a rebuild
writes back are described in ``router.index.resilient_index``, the facade over this.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, cast

from redis.exceptions import RedisError

from policies.tiers import Tier
from router.errors import UserError
from router.index.base import Clock, IndexedInstance, PrefixIndex, UnknownInstanceError
from router.index.mirror import (
    Blocks,
    Generational,
    Mirror,
    Rebuild,
    RecoveryStats,
    Restorable,
    instances_of,
)

__all__ = ["OutageRecovery"]

_OUTAGE = (RedisError, UserError, OSError)
_BLOCK_LIMIT = 1 << 64  # the Redis index takes block ids in [0, 2**64)
T = TypeVar("T")


class OutageRecovery:
    """The mirror and the state machine that keeps the shared ``primary`` in step with it."""

    def __init__(  # noqa: PLR0913 - keyword-only tunables with defaults, set once by ResilientIndex
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
        # what the shared index offers beyond the contract (``RedisPrefixIndex.contents``)
        self._contents: object = getattr(primary, "contents", None)
        self._generational = isinstance(self._contents, Generational)
        self._restorable = isinstance(self._contents, Restorable)
        self.local = Mirror(
            default_capacity_blocks=default_capacity_blocks, ttl_s=ttl_s, clock=clock
        )
        self.on_state_change = on_state_change
        self.stats = RecoveryStats()
        self._retry_after = retry_after_s
        self._verify_every = verify_every_s
        self._step_s = step_s
        self._batch = batch_blocks
        self.clock = clock
        self._timer = timer
        self._known: dict[str, IndexedInstance] = {}
        self._forgotten: set[str] = set()  # unregistered while only a rebuild could tell
        self._pending: deque[tuple[str, tuple[Any, ...]]] = deque(maxlen=max_pending)
        self._down = False
        self._next_try = 0.0
        self._next_verify = 0.0
        self._generation: str | None = None
        self._must_rebuild = False  # the shared index lost (or may have lost) our state
        self._rebuild: Rebuild | None = None
        self._reported = False

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
        self._next_try = self.clock() + self._retry_after
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
                if self.clock() < self._next_try:
                    return False
                self._resume()
            elif self.clock() >= self._next_verify:
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
        token = cast(Generational, self._contents).generation()
        self._next_verify = self.clock() + self._verify_every
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
            plan = self._rebuild or Rebuild()
            for instance in instances:
                iid = instance.instance_id
                plan.todo.append(Blocks(iid, self.local.lru(iid)))
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
            cast(Restorable, self._contents).restore(instances, chains)
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

    # -- the two paths: updates sent or queued, reads from the shared index or the mirror --
    def send(self, name: str, args: tuple[Any, ...]) -> None:
        """Send an update the mirror already has to the shared index, or queue it."""
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
                    self._lost(instances_of(name, args))  # the rebuild writes the mirror
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

    def read(
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

    def missing(self, ids: Iterable[str], tier: Tier | None, datacenter: str | None) -> list[str]:
        present = set(ids)
        return [
            iid
            for iid, spec in self._known.items()
            if iid not in present
            and (tier is None or spec.tier == tier)
            and (datacenter is None or spec.datacenter == datacenter)
        ]

    # -- the instances the mirror knows ---------------------------------------------------
    def remember(self, instance: IndexedInstance) -> None:
        """The instance is registered: in the mirror, and written again by any rebuild."""
        self.local.register(instance)
        self._known[instance.instance_id] = instance
        self._forgotten.discard(instance.instance_id)

    def forget(self, instance_id: str) -> None:
        self.local.unregister(instance_id)
        self._known.pop(instance_id, None)

    def knows(self, instance_id: str) -> bool:
        return instance_id in self._known

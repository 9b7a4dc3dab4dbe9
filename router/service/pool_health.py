"""Which of the pool's instances take requests: the circuit breakers' verdicts, the calls
cut short when an instance is taken out of service, and the readiness of the tiers."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from policies.tiers import Tier
from policies.types import ClusterView, InstanceLoad
from router.service.breaker import CircuitBreakers
from router.service.schemas import InstanceConfig

__all__ = ["PoolHealth", "Watch"]


@dataclass(eq=False, slots=True)
class Watch:
    """A call's deadline while it waits for an instance's answer; ``cut``: it was cut
    short because the instance was taken out of service, to ``grace_s`` from then."""

    deadline: asyncio.Timeout
    grace_s: float = 0.0
    cut: bool = False

    def cut_now(self) -> None:
        if self.cut or self.deadline.expired():
            return  # already expiring: it ends by itself
        self.cut = True
        soon = asyncio.get_running_loop().time() + self.grace_s
        when = self.deadline.when()
        if when is None or soon < when:
            self.deadline.reschedule(soon)


class _UntilEjected:
    """``PoolHealth.until_ejected``'s block: the watch is among the instance's waiting
    calls while in it."""

    __slots__ = ("_flight", "_health", "_instance_id", "_watch")

    def __init__(self, health: PoolHealth, instance_id: str, watch: Watch) -> None:
        self._health, self._instance_id, self._watch = health, instance_id, watch
        self._flight: _Waited | None = None

    def __enter__(self) -> Watch:
        flight = self._flight = self._health.inflight_of(self._instance_id)
        if flight is not None:
            flight.waiting.add(self._watch)
            if self._health.ejected(self._instance_id):
                self._watch.cut_now()
        return self._watch

    def __exit__(self, *_: object) -> None:
        if self._flight is not None:
            self._flight.waiting.discard(self._watch)


class _Waited(Protocol):
    """An instance's calls waiting for its answer."""

    waiting: set[Watch]


class PoolHealth:
    """The health side of an ``InstancePool``, over the pool's own tables."""

    def __init__(
        self,
        configs: Mapping[str, InstanceConfig],
        loads: Mapping[str, InstanceLoad],
        inflight: Mapping[str, _Waited],
        breakers: CircuitBreakers,
        view: ClusterView,
    ) -> None:
        self._configs, self._loads, self._inflight = configs, loads, inflight
        self.breakers = breakers
        self._view = view
        breakers.on_change = self.allowed

    def allowed(self, instance_id: str, allowed: bool) -> None:
        """The breakers' word: the instance takes requests (``allowed``) or not; calls
        waiting on one taken out are cut short."""
        load = self._loads.get(instance_id)
        if load is not None:
            load.healthy = allowed
        flight = self._inflight.get(instance_id)
        if not allowed and flight is not None:
            for watch in list(flight.waiting):  # ejected: nobody waits for it any longer
                watch.cut_now()

    def until_ejected(
        self, instance_id: str, deadline: asyncio.Timeout, grace_s: float = 0.0
    ) -> _UntilEjected:
        """While in this block, ``deadline`` expires ``grace_s`` after the instance's
        breaker opens (a hung engine ejected by its probes, say), or already is open: a
        call waiting on an instance out of service gives up then, not at its own deadline.
        The Watch it gives says whether that is why it ended (a class, not a generator:
        a relayed token enters one)."""
        return _UntilEjected(self, instance_id, Watch(deadline, grace_s))

    def inflight_of(self, instance_id: str) -> _Waited | None:
        """The instance's calls in flight (None for one not in the pool)."""
        return self._inflight.get(instance_id)

    def ejected(self, instance_id: str) -> bool:
        """Whether the instance is out of service (its breaker is open)."""
        return instance_id in self._configs and not self.breakers.allows(instance_id)

    def failed(self, instance_id: str, *, unreachable: bool = False) -> None:
        """A failure held against the instance (a timeout, a 5xx, a broken stream)."""
        if instance_id in self._configs:
            self.breakers.failure(instance_id, unreachable=unreachable)

    def succeeded(self, instance_id: str) -> None:
        """A request got what it needed from the instance."""
        if instance_id in self._configs:
            self.breakers.success(instance_id)

    def probed(self, instance_id: str, ok: bool) -> None:
        """A health probe answered (``ok``) or failed or timed out."""
        if instance_id in self._configs:
            self.breakers.probe(instance_id, ok)

    def ready_tiers(self) -> dict[Tier, bool]:
        """Whether each tier has a healthy instance (RLD is optional: absent means fine)."""
        out = {}
        for tier in Tier:
            pool = self._view.instances[tier]
            out[tier] = any(i.healthy for i in pool) if pool or tier is not Tier.RLD else True
        return out

    def readiness(self, *, needs_md: bool = True) -> tuple[bool, list[Tier]]:
        """Whether requests can be served, and the tiers running degraded. P and MD are
        needed (without either no pipeline exists; ``needs_md`` False: colocated engines,
        P alone); RLD is optional: with RLD down, requests go P-MD, so the router is
        ready, with RLD named as degraded."""
        tiers = self.ready_tiers()
        ready = tiers[Tier.P] and (tiers[Tier.MD] or not needs_md)
        return ready, [tier for tier in Tier if tier is Tier.RLD and not tiers[tier]]

"""Which of the pool's instances take requests: the circuit breakers' verdicts, the calls
cut short when an instance is taken out of service, and the readiness of the tiers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping
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

    @contextlib.contextmanager
    def until_ejected(
        self, instance_id: str, deadline: asyncio.Timeout, grace_s: float = 0.0
    ) -> Iterator[Watch]:
        """While in this block, ``deadline`` expires ``grace_s`` after the instance's
        breaker opens (a hung engine ejected by its probes, say), or already is open: a
        call waiting on an instance out of service gives up then, not at its own deadline.
        The Watch yielded says whether that is why it ended."""
        watch = Watch(deadline, grace_s)
        flight = self._inflight.get(instance_id)
        if flight is None:
            yield watch
            return
        flight.waiting.add(watch)
        try:
            if self.ejected(instance_id):
                watch.cut_now()
            yield watch
        finally:
            flight.waiting.discard(watch)

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

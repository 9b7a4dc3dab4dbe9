"""The engine instances the service drives: configs, adapters, live load, the cluster view."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from engines_adapter.contract import EngineAdapter
from policies.tiers import Tier
from policies.types import ClusterView, Decision, InstanceLoad, LinkState
from router.index.base import IndexedInstance
from router.service.breaker import CircuitBreakers
from router.service.claims import Claims, decision_load
from router.service.pool_health import PoolHealth, Watch
from router.service.schemas import InstanceConfig
from router.service.wan_ledger import WanLedger
from router.settings import ClusterSettings

__all__ = ["InstancePool", "UnknownInstance", "Watch", "indexed_instance"]

AdapterFactory = Callable[[InstanceConfig], EngineAdapter]


class UnknownInstance(KeyError):
    """No instance with this id is registered."""


@dataclass(slots=True)
class _InFlight:
    """What the router itself has sent an instance and not yet seen end, and what the
    engine last reported."""

    streams: int = 0  # generations the router has open on it
    prefill_tokens: int = 0  # prompt tokens of the prefills it waits for (expected uncached)
    reported_running: int = 0
    reported_waiting: int = 0
    # what the other router replicas have in flight there (streams, prefill tokens)
    peer_streams: int = 0
    peer_prefill_tokens: int = 0
    # the engine's inter-token latency histogram at the last poll (seconds, gaps)
    itl_sum_s: float = 0.0
    itl_count: float = 0.0
    itl_seen: bool = False  # a poll gave them (the first one's totals span the engine's life)
    # calls waiting for the instance's answer, cut short if it is ejected
    waiting: set[Watch] = field(default_factory=set)


def indexed_instance(config: InstanceConfig, block_size: int) -> IndexedInstance:
    """How the prefix index knows an instance: its id, tier, datacenter and capacity."""
    return IndexedInstance(
        config.instance_id,
        config.tier,
        config.datacenter,
        capacity_blocks=max(config.capacity_tokens // block_size, 1),
    )


class InstancePool:
    """Registered instances with their adapters and the load the router keeps for each.

    The ClusterView handed to the scheduler is built once; registering or removing
    an instance edits its lists in place, so decisions always see the current pool.

    An instance's load combines what its engine reports (polled) with what the router
    itself has in flight there, updated at once: engines' metrics lag (vLLM's running
    gauge was seen to stay at 0 through a 10 s burst of six requests on the CPU), and
    the queue of prompt tokens a prefill instance has yet to compute, which the
    policies' prefill-delay estimates need, is only known to the router.

    Which instances take requests (the circuit breakers, calls cut short when one is
    taken out, the tiers' readiness) is the pool's ``health`` (``PoolHealth``).
    """

    def __init__(
        self,
        cluster: ClusterSettings,
        adapter_factory: AdapterFactory,
        breakers: CircuitBreakers | None = None,
    ) -> None:
        """``breakers`` decide which instances take requests (default: 3 failures in a row
        take one out for 2 s, then a successful probe lets requests try it again).

        The prefix index is not the pool's: whoever registers an instance here registers
        it in the index too (on the index's lane, since a shared index is a network call).
        """
        self._factory = adapter_factory
        self.configs: dict[str, InstanceConfig] = {}
        self.adapters: dict[str, EngineAdapter] = {}
        self.loads: dict[str, InstanceLoad] = {}
        self._inflight: dict[str, _InFlight] = {}
        # work decided and not yet counted by an engine call (``router.service.claims``)
        self.claims = Claims()
        # loads are refreshed on the event loop and on the index lane (claims, the other
        # replicas' load): each refresh reads and writes as one step, so none writes late
        self._refreshing = threading.Lock()
        self.breakers = breakers or CircuitBreakers()
        # hears every change of the router's own in-flight work (replicas publish it)
        self.on_load_change: Callable[[], None] | None = None
        block_bytes = cluster.kv_bytes_per_token
        self.view = ClusterView(
            instances={tier: [] for tier in Tier},
            wan=LinkState(bandwidth_bps=cluster.wan_gbps * 1e9 / 8, rtt_s=cluster.wan_rtt_s),
            rdma=LinkState(bandwidth_bps=cluster.rdma_gbps * 1e9 / 8, rtt_s=cluster.rdma_rtt_s),
            kv_bytes_per_token=block_bytes,
            prefill_tokens_per_s=cluster.prefill_tokens_per_s,
            decode_step_s=cluster.decode_step_s,
        )
        # which instances take requests: the breakers, and the calls cut short when one opens
        self.health = PoolHealth(self.configs, self.loads, self._inflight, self.breakers,
                                 self.view)  # fmt: skip
        # the line's backlog as this router committed it (None: no WAN in the view)
        self.wan = WanLedger(self.view.wan) if self.view.wan is not None else None

    def wan_committed(self, decision: Decision, now: float) -> None:
        """The decision starts a KV copy to MD: across the line when MD sits in another
        datacenter than P (the ledger behind the view's WAN backlog)."""
        if self.wan is None or decision.md_instance is None or decision.predicted_wan_bytes <= 0:
            return
        p, md = self.configs.get(decision.p_instance), self.configs.get(decision.md_instance)
        if p is not None and md is not None and p.datacenter != md.datacenter:
            self.wan.commit(decision.predicted_wan_bytes, now)

    def register(self, config: InstanceConfig) -> None:
        """Add or replace an instance (its adapter is rebuilt)."""
        adapter = self._factory(config)  # first: a refused config changes nothing
        if config.instance_id in self.configs:
            self.remove(config.instance_id)
        load = InstanceLoad(
            config.instance_id,
            config.tier,
            config.datacenter,
            kv_capacity_tokens=config.capacity_tokens,
            max_batch=config.max_batch,
        )
        self.breakers.forget(config.instance_id)
        self.configs[config.instance_id] = config
        self.adapters[config.instance_id] = adapter
        self.loads[config.instance_id] = load
        self._inflight[config.instance_id] = _InFlight()
        self.view.instances[config.tier].append(load)
        self.view.instances[config.tier].sort(key=lambda i: i.instance_id)

    def remove(self, instance_id: str) -> EngineAdapter:
        """Forget an instance; returns its adapter so the caller can close it."""
        config = self.configs.pop(instance_id, None)
        if config is None:
            raise UnknownInstance(instance_id)
        load = self.loads.pop(instance_id)
        self._inflight.pop(instance_id, None)
        self.breakers.forget(instance_id)
        self.view.instances[config.tier].remove(load)
        return self.adapters.pop(instance_id)

    def get(self, instance_id: str) -> tuple[InstanceConfig, EngineAdapter, InstanceLoad]:
        if instance_id not in self.configs:
            raise UnknownInstance(instance_id)
        return self.configs[instance_id], self.adapters[instance_id], self.loads[instance_id]

    def view_for(self, model: str | None, without: Collection[str] = ()) -> ClusterView:
        """The cluster view a request for ``model`` is decided on: the instances serving it
        (``None``: those that declare no model), less ``without`` (instances the request
        already failed on)."""
        if not without and all(c.model == model for c in self.configs.values()):
            return self.view
        instances = {
            tier: [
                i for i in pool
                if i.instance_id not in without and self.configs[i.instance_id].model == model
            ]
            for tier, pool in self.view.instances.items()
        }  # fmt: skip
        return dataclasses.replace(self.view, instances=instances)

    def busy(self, instance_id: str) -> None:
        """The instance refused a request as being at capacity (a 429): not a fault, but
        load: one more request counts as queued there until its engine next reports."""
        flight = self._inflight.get(instance_id)
        if flight is not None:
            flight.reported_waiting += 1
            self._refresh(instance_id, flight)

    # -- load: the engine's report and the router's own in-flight work -------------------

    def reported(
        self,
        instance_id: str,
        *,
        running: int,
        waiting: int,
        kv_used: int,
        block_size: int | None = None,
        itl: tuple[float, float] = (0.0, 0.0),
    ) -> None:
        """What the engine's metrics said (a poll); ``block_size``: its KV block in tokens;
        ``itl``: its inter-token latency histogram's seconds and gaps so far, whose growth
        since the last poll gives its decode step now (kept while it decodes nothing)."""
        flight = self._inflight.get(instance_id)
        if flight is None:
            return
        flight.reported_running, flight.reported_waiting = running, waiting
        load = self.loads[instance_id]
        load.kv_used_tokens = kv_used
        if block_size:
            load.cache_block_tokens = block_size
        seconds, gaps = itl[0] - flight.itl_sum_s, itl[1] - flight.itl_count
        if gaps > 0 and seconds >= 0 and flight.itl_seen:  # a decrease: the engine restarted
            load.step_s = seconds / gaps
        flight.itl_sum_s, flight.itl_count, flight.itl_seen = itl[0], itl[1], True
        self._refresh(instance_id, flight)

    def stream_started(self, instance_id: str, delta: int = 1) -> None:
        """The router opened (``delta`` 1) or closed (-1) a generation on the instance."""
        flight = self._inflight.get(instance_id)
        if flight is not None:
            flight.streams = max(flight.streams + delta, 0)
            if delta > 0:
                self.claims.consume(instance_id, delta, 0)
            self._refresh(instance_id, flight)
            if self.on_load_change is not None:
                self.on_load_change()

    def prefill_started(self, instance_id: str, tokens: int) -> None:
        """The router sent (``tokens`` > 0) or got back (< 0) a prefill of that many
        prompt tokens to compute."""
        flight = self._inflight.get(instance_id)
        if flight is not None:
            flight.prefill_tokens = max(flight.prefill_tokens + tokens, 0)
            if tokens > 0:
                self.claims.consume(instance_id, 0, tokens)
            self._refresh(instance_id, flight)
            if self.on_load_change is not None:
                self.on_load_change()

    def claim(self, key: str, decision: Decision, prompt_tokens: int) -> None:
        """The work ``decision`` puts on its instances counts from now, under ``key`` (the
        request's), until the engine calls that carry it start or ``release(key)``."""
        for iid in self.claims.add(key, decision_load(decision, prompt_tokens)):
            self._refresh_id(iid)

    def release(self, key: str) -> None:
        """What is left of ``key``'s claim stops counting (its first token came, or it
        gave up)."""
        released = self.claims.release(key)
        for iid in released:
            self._refresh_id(iid)
        if released and self.on_load_change is not None:
            self.on_load_change()

    def own_load(self) -> dict[str, tuple[int, int]]:
        """What this router has in flight per instance (claimed work included): (open
        streams, prefill tokens)."""
        flights = list(self._inflight.items())  # one step: the loop may add an instance
        out = {}
        for iid, f in flights:
            streams, tokens = self.claims.total(iid)
            out[iid] = (f.streams + streams, f.prefill_tokens + tokens)
        return out

    def peers_load(self, load: dict[str, tuple[int, int]]) -> None:
        """What the other router replicas have in flight per instance (absent: nothing);
        it counts in each instance's load as the router's own does."""
        for iid, flight in list(self._inflight.items()):
            streams, tokens = load.get(iid, (0, 0))
            if (streams, tokens) != (flight.peer_streams, flight.peer_prefill_tokens):
                flight.peer_streams, flight.peer_prefill_tokens = streams, tokens
                self._refresh(iid, flight)

    def _refresh_id(self, instance_id: str) -> None:
        flight = self._inflight.get(instance_id)
        if flight is not None:
            self._refresh(instance_id, flight)

    def _refresh(self, instance_id: str, flight: _InFlight) -> None:
        load = self.loads.get(instance_id)
        if load is None:
            return
        with self._refreshing:
            streams, tokens = self.claims.total(instance_id)
            # the router's open streams include those the engine reports waiting: they
            # count once, as waiting, and the rest as running until the engine says so
            own = flight.streams + streams + flight.peer_streams
            load.running = max(flight.reported_running, own - flight.reported_waiting)
            load.queued = flight.reported_waiting
            load.queued_prefill_tokens = flight.prefill_tokens + tokens + flight.peer_prefill_tokens

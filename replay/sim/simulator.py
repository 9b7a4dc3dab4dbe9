"""The discrete-event simulator of a PDD deployment, driven by the router's decisions.

Each arriving trace request is shown to the decider (the production scheduler) as a
RequestView (block hashes, input length, never the output length) together with the
live ClusterView; its Decision is then executed: prefill on the chosen P instance,
the KV copies over RDMA and/or the WAN, decode on RLD and/or MD, the handoff. The
engines' KV events reach the router's index after a delay.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

from policies.admission import Overloaded
from policies.tiers import Tier
from policies.types import ClusterView, Decision, Pipeline, RequestView
from replay.presets.cluster_preset import ClusterPreset
from replay.sim.cluster import SimCluster, build_cluster
from replay.sim.colocated_instance import ColocatedInstance
from replay.sim.decode_instance import DecodeInstance
from replay.sim.event_loop import EventLoop
from replay.sim.events import Priority
from replay.sim.frontend import Frontend
from replay.sim.handoff import HandoffDriver
from replay.sim.kv_events import KvEventFeed
from replay.sim.link import Transfer
from replay.sim.request_state import DecodeServer, Leg, LegState, SimRequest
from replay.sim.sim_settings import ProgressObserver, SimHooks, SimSettings
from replay.sim.timeline import Timeline
from replay.trace.record import TraceRequest
from router.index.base import IndexedInstance, PrefixIndex

__all__ = ["Decider", "ProgressObserver", "Simulator"]

_VIA_RLD = frozenset({Pipeline.P_RLD, Pipeline.P_RLD_MD})  # the pipelines decoding on RLD
_VIA_MD = frozenset({Pipeline.P_MD, Pipeline.P_RLD_MD})  # and on MD


class Decider(Protocol):
    """What the simulator needs of the scheduler."""

    def decide(self, request: RequestView, cluster: ClusterView) -> Decision: ...


class Simulator:
    """One run: a cluster built from a preset, a decider, an index fed by KV events."""

    def __init__(
        self,
        preset: ClusterPreset,
        decider: Decider,
        index: PrefixIndex,
        *,
        block_size: int,
        settings: SimSettings | None = None,
        hooks: SimHooks | None = None,
        loop: EventLoop | None = None,
    ) -> None:
        """The cluster of ``preset``, deciding with ``decider``, ``index`` fed by the
        engines' KV events as ``settings`` say; ``hooks`` are told of requests as they end."""
        settings = settings or SimSettings()
        hooks = hooks or SimHooks()
        self.loop = loop or EventLoop()
        self.preset = preset
        self.decider = decider
        self.index = index
        self.block_size = block_size
        pools = preset.pools()
        home = {pool.datacenter for pool in pools.values() if pool.tier is Tier.P}
        remote = frozenset(
            f"{name}-{i}"
            for name, pool in pools.items()
            if pool.datacenter not in home
            for i in range(pool.instances)
        )
        self.feed = KvEventFeed(
            self.loop, index, settings.kv_event_delay_s, enabled=settings.kv_events,
            remote=remote, remote_delay_s=settings.kv_event_wan_delay_s,
        )  # fmt: skip
        self._on_finished = hooks.on_finished
        # on-demand memory: a copy reserves its prompt; the output grows on the instance
        self._reserve_output = preset.spec.memory.allocation == "reserve-output"
        self.cluster: SimCluster = build_cluster(
            self.loop,
            preset,
            block_size,
            self.feed,
            settings,
            self._prefilled,
            self._reserved,
            self._decoded,
        )
        self.handoff = HandoffDriver(
            self.loop, self.cluster, preset.spec.handoff, self._abort, self._finish
        )
        self.requests: list[SimRequest] = []  # every request, when there is no sink
        self.arrived = 0
        self._open: dict[int, SimRequest] = {}  # requests in flight, when there is a sink
        self._sink = hooks.sink
        self._first_arrival_s: float | None = None
        self.timeline = (
            Timeline(self.loop, self.cluster, settings.timeline_period_s)
            if settings.timeline_period_s is not None
            else None
        )
        # the router's own time per request, one after another (timing.router_s)
        self._router = Frontend(self.loop, preset.spec.timing.router_s, self._route)
        self.finished = 0
        self._progress = hooks.progress
        self._arrivals: Iterator[TraceRequest] = iter(())
        self._rate_scale = 1.0
        for name, pool in preset.pools().items():
            capacity = preset.kv_capacity_tokens(pool) // block_size
            known = capacity if settings.index_knows_capacity else None
            for i in range(pool.instances):
                index.register(IndexedInstance(f"{name}-{i}", pool.tier, pool.datacenter, known))

    # -- running ----------------------------------------------------------------------

    def start(self, trace: Iterable[TraceRequest], rate_scale: float = 1.0) -> None:
        """Queue the arrivals of ``trace`` (sorted by arrival), ``rate_scale`` times faster;
        ``loop.run()`` then plays them (``run`` does both)."""
        self._arrivals = iter(trace)
        self._rate_scale = rate_scale
        self._schedule_next()
        if self.timeline is not None and self._first_arrival_s is not None:
            self.timeline.start(self._first_arrival_s)

    def run(self, trace: Iterable[TraceRequest], rate_scale: float = 1.0) -> list[SimRequest]:
        """Replay ``trace`` to the end; the simulated requests in arrival order (none when
        they went to the sink)."""
        self.start(trace, rate_scale)
        self.loop.run()
        if self._sink is not None:
            unfinished, self._open = self._open, {}
            for key in sorted(unfinished):
                self._sink(unfinished[key])
        if self._progress is not None:
            self._progress.advance(self.finished)
        return self.requests

    def submit(self, record: TraceRequest, arrival_s: float) -> None:
        """One more request arriving at ``arrival_s`` (not before now), outside the trace:
        a closed-loop client's next request, sent when its previous one ended."""
        self._schedule(record, max(arrival_s, self.loop.now))

    def _schedule_next(self) -> None:
        record = next(self._arrivals, None)
        if record is None:
            return
        self._schedule(record, record.arrival_s / self._rate_scale)

    def _schedule(self, record: TraceRequest, arrival_s: float) -> None:
        request = SimRequest(self.arrived, record, arrival_s)
        if self._first_arrival_s is None:
            self._first_arrival_s = request.arrival_s
        self.arrived += 1
        if self._sink is None:
            self.requests.append(request)
        else:
            self._open[request.key] = request
        self.loop.at(request.arrival_s, Priority.ARRIVAL, self._arrive, request)

    def _arrive(self, request: SimRequest) -> None:
        self._schedule_next()
        self._router.submit(request)

    def _route(self, request: SimRequest) -> None:
        """The router takes the request: decides, and sends it to its prefill instance."""
        cluster = self.cluster
        cluster.view.now = self.loop.now
        cluster.sync_links()
        trace = request.trace
        view = RequestView(  # chain, block size, input length, max_tokens (never known here)
            request.chain, trace.block_size, request.input_length, None,
            trace.session_id, request.arrival_s, str(request.key),
        )  # fmt: skip
        try:
            decision = self.decider.decide(view, cluster.view)
        except Overloaded as refused:
            self._reject(request, refused)
            return
        self._assign(request, decision)
        p = request.p
        assert p is not None
        p.submit(request)

    def _reject(self, request: SimRequest, refused: Overloaded) -> None:
        """Admission control refused the request: it ends at arrival, counted as rejected."""
        request.rejected = refused
        request.finished_s = self.loop.now
        self.finished += 1
        if self._progress is not None and self.finished & 63 == 0:
            self._progress.advance(self.finished)
        if self._sink is not None and self._open.pop(request.key, None) is not None:
            self._sink(request)

    def _assign(self, request: SimRequest, decision: Decision) -> None:
        cluster = self.cluster
        request.decision = decision
        request.pipeline = decision.pipeline
        p = cluster.prefill.get(decision.p_instance)
        if p is None:
            raise RuntimeError(f"policy {decision.policy} chose unknown P {decision.p_instance!r}")
        if (decision.pipeline is Pipeline.COLOCATED) != isinstance(p, ColocatedInstance):
            raise RuntimeError(
                f"policy {decision.policy} chose {decision.pipeline} on {p.id!r}, which is "
                + ("a colocated engine" if isinstance(p, ColocatedInstance) else "a P instance")
            )
        request.p = p
        if decision.pipeline in _VIA_RLD:
            request.rld = self._decode_instance(decision, decision.rld_instance, Tier.RLD)
        if decision.pipeline in _VIA_MD:
            request.md = self._decode_instance(decision, decision.md_instance, Tier.MD)
        for dest in (request.rld, request.md):
            if dest is not None:  # on its way: counted in the instance's load until it lands
                dest.load.pending += 1
                dest.load.pending_tokens += request.input_length + request.output_length

    def _decode_instance(
        self, decision: Decision, instance_id: str | None, role: Tier
    ) -> DecodeInstance:
        instance = self.cluster.decode.get(instance_id or "")
        if instance is None:
            raise RuntimeError(
                f"policy {decision.policy} chose {decision.pipeline} with unknown "
                f"{role.value} instance {instance_id!r}"
            )
        return instance

    # -- prefill done: the KV copies leave P --------------------------------------------

    def _prefilled(self, request: SimRequest) -> None:
        p = request.p
        assert p is not None
        request.prefill_end_s = self.loop.now
        self.feed.stored(p.id, p.cache.kept(request.chain))
        decision = request.decision
        assert decision is not None
        for dest in (request.rld, request.md):
            if dest is not None:  # it reaches the instance now: its own queue counts it
                dest.load.pending -= 1
                dest.load.pending_tokens -= request.input_length + request.output_length
        if request.rld is not None:
            request.rld_leg = self._leg(request, request.rld, reuse=True)
        if request.md is not None:
            request.md_leg = self._leg(request, request.md, reuse=decision.reuse_md_cache)
        for leg in (request.rld_leg, request.md_leg):
            if leg is not None:
                leg.dest.reserve(leg)

    def _leg(self, request: SimRequest, dest: DecodeServer, *, reuse: bool) -> Leg:
        request.outgoing += 1
        extra = request.private_tokens
        if self._reserve_output:
            extra += request.output_length
        extra += dest.cache.padding(len(request.chain) * dest.cache.block_size + extra)
        return Leg(request, dest, reuse, extra)

    def _reserved(self, leg: Leg) -> None:
        """Memory granted on the destination: ship what it lacks (or everything)."""
        request = leg.request
        p = request.p
        assert p is not None
        if not leg.reuse_cache:
            leg.hit_tokens = 0
        leg.nbytes = (request.input_length - leg.hit_tokens) * self.cluster.kv_bytes_per_token
        leg.link = self.cluster.link_between(p.datacenter, leg.dest.datacenter)
        leg.transfer = leg.link.start(leg.nbytes, self._landed, leg)

    def _landed(self, transfer: Transfer) -> None:
        leg: Leg = transfer.tag
        request = leg.request
        leg.dest.landed(leg)
        self._left_p(request)
        self.feed.stored(leg.dest.id, leg.dest.cache.kept(request.chain))
        if leg.link is self.cluster.wan:
            request.wan_bytes += leg.nbytes
        if leg is request.md_leg:
            request.transfer_s = transfer.duration_s
            if request.pipeline == Pipeline.P_MD:
                leg.dest.arrive(leg)
            else:
                self.handoff.md_ready(request)
        elif request.pipeline == Pipeline.P_RLD_MD:
            self.handoff.rld_landed(request)
        else:
            if request.md_leg is None:
                request.transfer_s = transfer.duration_s
            leg.dest.arrive(leg)

    def _left_p(self, request: SimRequest) -> None:
        request.outgoing -= 1
        if request.outgoing == 0 and request.p is not None:
            request.p.release(request)

    def _abort(self, leg: Leg) -> None:
        """Drop a copy: cancel its transfer or its wait for memory, free its memory."""
        if leg.state == LegState.CLOSED:
            return
        if leg.running:
            leg.dest.leave(leg)
        if leg.state == LegState.SENDING:
            if leg.link is not None and leg.transfer is not None:
                leg.link.cancel(leg.transfer)
                if leg.link is self.cluster.wan:
                    leg.request.wan_bytes += leg.transfer.sent_bytes
            self._left_p(leg.request)
        elif leg.state == LegState.RESERVING:
            self._left_p(leg.request)
        leg.dest.close(leg)

    # -- decode done ------------------------------------------------------------------

    def _decoded(self, request: SimRequest, instance: DecodeInstance | ColocatedInstance) -> None:
        if instance.tier == Tier.RLD:
            request.rld_end_s = self.loop.now
            if request.md_leg is not None:
                self.handoff.rld_finished(request)
        request.finished_on = instance.id
        self._finish(request)

    def _finish(self, request: SimRequest) -> None:
        request.finished_s = self.loop.now
        for leg in (request.rld_leg, request.md_leg):
            if leg is not None:
                self._abort(leg)
        self.finished += 1
        if self._on_finished is not None:
            self._on_finished(request)
        if self._progress is not None and (self.finished & 63 == 0 or not self.loop.pending()):
            self._progress.advance(self.finished)
        if self._sink is not None and self._open.pop(request.key, None) is not None:
            self._sink(request)

"""The decision core: index matches per tier, the policy, and a JSON line per decision.

The live service and the replay simulator both call ``Scheduler.decide``; nothing
else decides. It is synchronous: with the Redis index the match is one round trip.

Around the policy the scheduler keeps what a pure policy cannot: each session's
history (attached to the request view), the router's own record of where it sent
requests (in approximate mode that record *is* the index: no KV events; beside KV
events, an LRU of each engine's KV size that also drops what the events report removed),
and, when a hit-rate model is configured, the predicted realized hit of every candidate
instance.
Predictions reach the policy through ``matches`` as the expected number of leading
blocks still held when the request is served, so every policy uses the model when
there is one and the raw match otherwise, unchanged.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TextIO

from policies.admission import Overloaded
from policies.base import Policy
from policies.tiers import Tier
from policies.types import ClusterView, Decision, InstanceLoad, RequestView
from router.index.base import Clock, IndexedInstance, PrefixIndex, UnknownInstanceError
from router.index.memory_index import MemoryPrefixIndex
from router.predictor.features import CandidateRows, FeatureBuilder, FloatArray
from router.predictor.outcome import DecisionOutcome
from router.predictor.sessions import SessionTracker
from router.predictor.tracking import TrackedIndex

__all__ = ["HitPredictor", "Scheduler", "decision_line"]

Grouped = dict[Tier, dict[str, int]]
_TIERS = tuple(Tier)  # iterating the enum class itself is slow


class HitPredictor(Protocol):
    """A fitted hit-rate model: feature rows (``router.predictor.features``) to hit rates."""

    def predict_rows(self, rows: CandidateRows) -> FloatArray:
        """Predicted realized hit rate (0..1) of each row."""
        ...


class Scheduler:
    """Turns a request and a view of the cluster into a Decision."""

    def __init__(
        self,
        index: PrefixIndex,
        policy: Policy,
        *,
        decision_log: TextIO | None = None,
        timer: Callable[[], float] = time.perf_counter,
        record_routes: bool = False,
        predictor: HitPredictor | None = None,
        clock: Clock | None = None,
        log_fields: Mapping[str, Any] | None = None,
    ) -> None:
        """``record_routes`` is approximate mode: the scheduler stores each request's chain
        on the instances it chose (no KV events needed). ``predictor`` turns index matches
        into predicted hits. ``clock`` times the features (default: the index's, if tracked).
        ``log_fields`` are added to every decision line (e.g. an experiment arm's name)."""
        self.index = index
        self.policy = policy
        self.decision_log = decision_log
        self.log_fields = dict(log_fields or {})
        self.record_routes = record_routes
        self.predictor = predictor
        self._timer = timer
        tracker = index if isinstance(index, TrackedIndex) else None
        self._clock: Clock = clock or (tracker.clock if tracker is not None else time.monotonic)
        self.features = FeatureBuilder(tracker, approximate=record_routes)
        self.sessions = SessionTracker()
        # The router's own record of its routes, kept beside a KV-event-fed index for the
        # features and the approximate-mode baseline; in approximate mode the index is it.
        # Each instance's record is an LRU of the engine's KV size (``_route_capacity``, in
        # blocks, from the cluster view), and forgets the blocks whose removal the index
        # hears (KV events), so what the engine evicted ages out of it too.
        self._routes: MemoryPrefixIndex | None = None
        self._route_capacity: dict[str, int] = {}
        self._tracker = tracker
        if tracker is not None and not record_routes:
            tracker.removal_listeners.append(self._heard_removal)
        self._tier_of: dict[str, Tier] = {}
        self.decisions = 0
        self.rejections = 0  # requests the policy refused (admission control)
        self.decide_seconds = 0.0

    @property
    def _wants_features(self) -> bool:
        return self.decision_log is not None or self.predictor is not None

    def refresh_instances(self) -> None:
        """Re-read which tier each instance belongs to (after registering or removing one)."""
        instances = self.index.instances()
        self._tier_of = {i.instance_id: i.tier for i in instances}
        if self._routes is not None:
            for inst in instances:
                capacity = self._route_capacity.get(inst.instance_id, inst.capacity_blocks)
                self._routes.register(_with_capacity(inst, capacity))
            for inst in self._routes.instances():
                if inst.instance_id not in self._tier_of:
                    self._routes.unregister(inst.instance_id)

    def release(self) -> None:
        """Forget what is kept of past requests (session history, the record of routes): the
        scheduler decides nothing more (the arm of a stopped experiment)."""
        self.sessions = SessionTracker()
        self._routes = None
        self._route_capacity = {}
        if self._tracker is not None and self._heard_removal in self._tracker.removal_listeners:
            self._tracker.removal_listeners.remove(self._heard_removal)

    def matches(self, request: RequestView) -> dict[Tier, dict[str, int]]:
        """The index's answer for the request's chain, grouped by tier."""
        raw = self.index.match(request.chain)
        if not raw.keys() <= self._tier_of.keys():  # an instance registered since
            self.refresh_instances()
        return self._group(raw)

    def _group(self, raw: Mapping[str, int]) -> Grouped:
        grouped: Grouped = {tier: {} for tier in _TIERS}
        for iid, blocks in raw.items():
            tier = self._tier_of.get(iid)
            if tier is not None:
                grouped[tier][iid] = blocks
        return grouped

    def _route_matches(self, request: RequestView, matches: Grouped) -> Grouped:
        if self.record_routes:
            return matches
        if self._routes is None:
            self._routes = MemoryPrefixIndex(clock=self._clock)
            self.refresh_instances()
        return self._group(self._routes.match(request.chain))

    def decide(
        self,
        request: RequestView,
        cluster: ClusterView,
        admit: Callable[[Decision], bool] | None = None,
    ) -> Decision:
        """The decision for ``request`` on ``cluster``. ``admit``, when given, accepts it
        (True) or has brought ``cluster``'s loads up to date and asks for another (False;
        it ends that, by accepting one): only the accepted one is recorded and logged."""
        start = self._timer()
        now = self._clock()
        request = self.sessions.attach(request, now)
        matches = self.matches(request)
        routes = self._route_matches(request, matches) if self._wants_features else matches
        rows: CandidateRows | None = None
        predicted: dict[Tier, dict[str, float]] | None = None
        policy_matches: Mapping[Tier, Mapping[str, int]] = matches
        if self.predictor is not None:
            rows = self.features.build(request, cluster, matches, routes, now)
            hits = self.predictor.predict_rows(rows)
            predicted = {tier: {} for tier in Tier}
            for (tier, iid), hit in zip(rows.keys, hits, strict=True):
                predicted[tier][iid] = float(hit)
            policy_matches = expected_blocks(request, predicted)
        try:
            decision = self.policy.decide(request, cluster, policy_matches)
            while admit is not None and not admit(decision):
                decision = self.policy.decide(request, cluster, policy_matches)
        except Overloaded as refused:
            self._refused(request, cluster, refused, start)
            raise
        chosen = _chosen(decision)
        extra: dict[str, Any] | None = None
        if self.decision_log is not None:
            logged = self.features.build(request, cluster, matches, routes, now, only=chosen)
            extra = {
                "kind": "decision",
                "id": request.request_id if request.request_id is not None else str(self.decisions),
                "index_mode": "approximate" if self.record_routes else "events",
                "arrival_s": request.arrival_s,
                "matches": {t.value: m for t, m in matches.items()},
                "route_matches": {t.value: m for t, m in routes.items()},
                "features": {
                    tier.value: {"instance": iid, **logged.as_dict(i)}
                    for i, (tier, iid) in enumerate(logged.keys)
                },
                "history": _history(request),
                **self.log_fields,
            }
            if predicted is not None:
                extra["prediction"] = {
                    t.value: {iid: round(h, 6) for iid, h in per.items()}
                    for t, per in predicted.items()
                }
        self._record(request, cluster, chosen)
        self.sessions.arrived(request, now)
        self.decide_seconds += self._timer() - start
        self.decisions += 1
        if self.decision_log is not None:
            line = decision_line(request, cluster, matches, decision, extra)
            self.decision_log.write(line + "\n")
        return decision

    def _refused(
        self, request: RequestView, cluster: ClusterView, refused: Overloaded, start: float
    ) -> None:
        """Admission control refused the request: counted, and a ``rejected`` log line."""
        self.rejections += 1
        self.decide_seconds += self._timer() - start
        if self.decision_log is not None:
            record = {
                "kind": "rejected",
                "id": request.request_id if request.request_id is not None else str(self.decisions),
                "t": cluster.now,
                "policy": refused.policy,
                "bottleneck": refused.bottleneck.value,
                "retry_after_s": round(refused.retry_after_s, 6),
                "reason": refused.reason,
                **self.log_fields,
            }
            self.decision_log.write(json.dumps(record, separators=(",", ":")) + "\n")

    def _record(
        self, request: RequestView, cluster: ClusterView, chosen: Mapping[Tier, str]
    ) -> None:
        if self.record_routes:
            target: PrefixIndex | None = self.index
        else:
            target = self._routes
            if target is not None:
                self._size_routes(target, request, cluster, chosen)
        if target is None or not request.chain:
            return
        for iid in chosen.values():
            target.store(iid, request.chain)

    def _heard_removal(self, instance_id: str, blocks: Sequence[int] | None) -> None:
        """The index heard the engine drop these blocks (None: all of them): so does the
        record. Its LRU of the engine's nominal size cannot know what memory held by
        requests in flight evicted early; the events can, once they arrive."""
        routes = self._routes
        if routes is None or instance_id not in self._tier_of:
            return
        try:
            if blocks is None:
                routes.clear(instance_id)
            else:
                routes.remove(instance_id, blocks)
        except UnknownInstanceError:
            pass

    def _size_routes(
        self,
        routes: MemoryPrefixIndex,
        request: RequestView,
        cluster: ClusterView,
        chosen: Mapping[Tier, str],
    ) -> None:
        """Bound each chosen instance's record of routes by the engine's KV memory, in
        blocks (as ``lru_frac`` does): without it, beside a KV-event-fed index not told the
        capacities, the record says "sent there once" forever."""
        block = max(request.block_size, 1)
        for tier, iid in chosen.items():
            load = _load_of(cluster, tier, iid)
            if load is None or load.kv_capacity_tokens <= 0:
                continue
            capacity = max(load.kv_capacity_tokens // block, 1)
            if self._route_capacity.get(iid) == capacity:
                continue
            self._route_capacity[iid] = capacity
            routes.register(IndexedInstance(iid, tier, load.datacenter, capacity))

    def record_outcome(self, outcome: DecisionOutcome) -> None:
        """What happened to a decided request: session history, and an outcome log line."""
        if outcome.output_tokens is not None:
            self.record_output(outcome.session_id, outcome.output_tokens)
        self.log_outcome(outcome)

    def record_output(self, session_id: str | None, output_tokens: int) -> None:
        """A request of the session produced this many tokens (its history, at once)."""
        self.sessions.finished(session_id, output_tokens)

    def log_outcome(self, outcome: DecisionOutcome) -> None:
        """The outcome line of the decision log (nothing without a log)."""
        if self.decision_log is not None:
            # live-service fields are left out when unset: the simulator's lines stay as they were
            live = ("source", "events_hit")
            drop = {"request_id", *(k for k in live if getattr(outcome, k) is None)}
            body = outcome.model_dump(mode="json", exclude=drop)
            record = {"kind": "outcome", "id": outcome.request_id, **body}
            line = json.dumps(record, separators=(",", ":"), sort_keys=True)
            self.decision_log.write(line + "\n")  # one write: lines never interleave


def expected_blocks(
    request: RequestView, predicted: Mapping[Tier, Mapping[str, float]]
) -> dict[Tier, dict[str, int]]:
    """Predicted hit rates as the leading blocks expected to be held when served."""
    n, bs, most = request.input_length, max(request.block_size, 1), len(request.chain)
    return {
        tier: {iid: min(most, max(0, round(hit * n / bs))) for iid, hit in per.items()}
        for tier, per in predicted.items()
    }


def _load_of(cluster: ClusterView, tier: Tier, instance_id: str) -> InstanceLoad | None:
    for load in cluster.instances.get(tier, ()):
        if load.instance_id == instance_id:
            return load
    return None


def _with_capacity(instance: IndexedInstance, capacity: int | None) -> IndexedInstance:
    if capacity == instance.capacity_blocks:
        return instance
    return IndexedInstance(instance.instance_id, instance.tier, instance.datacenter, capacity)


def _chosen(decision: Decision) -> dict[Tier, str]:
    chosen = {Tier.P: decision.p_instance}
    if decision.md_instance is not None:
        chosen[Tier.MD] = decision.md_instance
    if decision.rld_instance is not None:
        chosen[Tier.RLD] = decision.rld_instance
    return chosen


def _history(request: RequestView) -> dict[str, Any] | None:
    h = request.history
    if h is None:
        return None
    return {
        "turns": h.turns,
        "last_input_length": h.last_input_length,
        "since_last_s": round(h.since_last_s, 6),
        "outputs_known": h.outputs_known,
        "mean_output": h.mean_output,
    }


def decision_line(
    request: RequestView,
    cluster: ClusterView,
    matches: dict[Tier, dict[str, int]],
    decision: Decision,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """One decision as a JSON line: what the scheduler saw, predicted and chose.

    ``extra`` adds the keys of the predictor's decision log (id, features, prediction,
    history, ...) next to the original ones, which keep their meaning.
    """
    best = {
        tier.value: max(per_instance.values(), default=0) for tier, per_instance in matches.items()
    }
    record = {
        "t": cluster.now,
        "request": {
            "input_length": request.input_length,
            "blocks": len(request.chain),
            "block_size": request.block_size,
            "max_tokens": request.max_tokens,
            "session_id": request.session_id,
        },
        "best_match_blocks": best,
        "wan": None
        if cluster.wan is None
        else {
            "active_transfers": cluster.wan.active_transfers,
            "backlog_bytes": cluster.wan.backlog_bytes,
        },
        "decision": decision.model_dump(mode="json"),
        **(extra or {}),
    }
    return json.dumps(record, separators=(",", ":"), sort_keys=True)

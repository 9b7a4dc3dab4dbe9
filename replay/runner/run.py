"""Replay a trace through the simulated cluster: the function behind `replay run`.

``run_replay`` loads the preset, checks that the cluster can serve the trace with the
policy, wires the production scheduler (the same ``Scheduler``, policy and
``MemoryPrefixIndex`` the live router uses, on the simulated clock) into the simulator,
runs it and summarizes the outcome. A trace file is streamed through the run (read as
arrivals come, checked on the way) and each request's record is kept as compact columns
once it ends, so memory follows the cluster's state, not the trace's length.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

from policies.registry import UnknownPolicyError, build_policy, parse_policy
from replay.metrics.columns import RecordColumns
from replay.metrics.record import RequestRecord, record_fields
from replay.metrics.summary import SlaThresholds, Summary, summarize
from replay.metrics.writers import write_run
from replay.presets.cluster_preset import ClusterPreset
from replay.presets.loader import load_preset
from replay.runner.checks import backlog_warning, check_cluster, cluster_warnings
from replay.runner.outcomes import outcome_of
from replay.runner.trace_source import (
    CheckedTrace,
    TraceShape,
    UnsortedTrace,
    count_requests,
)
from replay.sim.event_loop import EventLoop
from replay.sim.kv_events import KV_EVENT_DELAY_S
from replay.sim.request_state import SimRequest
from replay.sim.simulator import ProgressObserver, Simulator
from replay.trace.checks import TraceChecks
from replay.trace.formats import read_trace, resolve_format
from replay.trace.record import TraceRequest
from router import __version__
from router.errors import UserError
from router.index.memory_index import MemoryPrefixIndex
from router.scheduler import HitPredictor
from router.scheduler_factory import SchedulerFactory

__all__ = ["IndexCapacity", "IndexMode", "ReplayResult", "run_replay"]

IndexMode = Literal["events", "approximate"]
"""events: engines' KV events feed the index; approximate: the router records its routes."""
IndexCapacity = Literal["exact", "unbounded"]
"""exact: the index bounds each instance at its KV capacity; unbounded: it is not told."""
TIMELINE_PERIOD_S = 1.0
"""How often (simulated seconds) the run samples the tiers' and the line's load."""


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What a replay produced: the summary and one record per request (arrival order;
    ``RecordColumns`` for a replay's own records)."""

    summary: Summary
    records: Sequence[RequestRecord]

    def write(self, out_dir: Path) -> None:
        write_run(out_dir, self.summary, self.records)


@dataclass(slots=True)
class _Trace:
    """A replay's requests: streamed from a file (checked as they are read), or in memory."""

    name: str
    first: TraceRequest
    rest: Iterator[TraceRequest]
    total: int | None  # how many, when known without reading them all
    held: list[TraceRequest] | None = None  # the requests, when given in memory
    checked: CheckedTrace | None = None  # a file's stream, once it is replayed
    checks: TraceChecks | None = None  # a file's contradictions, as far as it was read

    def requests(self, preset: ClusterPreset) -> Iterator[TraceRequest]:
        stream = itertools.chain((self.first,), self.rest)
        if self.held is not None:
            return stream
        self.checked = CheckedTrace(stream, preset)
        return self.checked

    def shape(self) -> TraceShape:
        if self.held is not None:
            return TraceShape.of(self.held)
        assert self.checked is not None
        return self.checked.shape


def _load_trace(
    trace: str | Path | Sequence[TraceRequest],
    trace_format: str | None = None,
    block_size: int | None = None,
    *,
    count: bool = False,
    name: str = "<memory>",
    max_requests: int | None = None,
) -> _Trace:
    """A file's first request and a stream of the rest (``count``: the requests counted
    first, for a progress bar), or requests given in memory, sorted by arrival; only the
    first ``max_requests`` of them (in the file's or the sequence's order) when given."""
    if isinstance(trace, str | Path):
        fmt = resolve_format(trace_format) if trace_format is not None else None
        checks = TraceChecks(str(trace))
        stream: Iterator[TraceRequest] = read_trace(trace, fmt, block_size, checks=checks)
        if max_requests is not None:
            stream = itertools.islice(stream, max_requests)
        first = next(stream, None)
        if first is None:
            raise UserError(f"{trace}: the trace has no requests")
        total = count_requests(trace, fmt) if count else None
        if total is not None and max_requests is not None:
            total = min(total, max_requests)
        return _Trace(str(trace), first, stream, total, checks=checks)
    kept = trace if max_requests is None else trace[:max_requests]
    requests = sorted(kept, key=lambda r: r.arrival_s)  # stable: file order among equals
    if not requests:
        raise UserError(f"{name}: the trace has no requests")
    return _Trace(name, requests[0], iter(requests[1:]), len(requests), requests)


@dataclass(frozen=True, slots=True)
class _RunOptions:
    policy: str
    policy_params: Mapping[str, Any] | None
    rate_scale: float
    seed: int
    kv_event_delay_s: float
    kv_event_wan_delay_s: float
    progress: ProgressObserver | None
    decision_log: TextIO | None
    index_mode: IndexMode
    predictor: HitPredictor | None
    index_capacity: IndexCapacity


def _simulate(
    cluster: ClusterPreset, source: _Trace, o: _RunOptions
) -> tuple[RecordColumns, Simulator]:
    """One run of the simulator over ``source``: each request's record as it ends."""
    loop = EventLoop()
    schedulers = SchedulerFactory.create(
        MemoryPrefixIndex(clock=loop.clock),
        predictor=o.predictor,
        record_routes=o.index_mode == "approximate",
        decision_log=o.decision_log,
        clock=loop.clock,
    )
    scheduler = schedulers.build(build_policy(parse_policy(o.policy, o.policy_params)))
    records = RecordColumns()

    def finished(request: SimRequest) -> None:
        scheduler.record_outcome(outcome_of(request))

    def keep(request: SimRequest) -> None:
        records.put_fields(request.key, record_fields(request))

    sim = Simulator(
        cluster,
        scheduler,
        schedulers.index,
        block_size=source.first.block_size,
        seed=o.seed,
        kv_event_delay_s=o.kv_event_delay_s,
        kv_event_wan_delay_s=o.kv_event_wan_delay_s,
        progress=o.progress,
        loop=loop,
        kv_events=o.index_mode == "events",
        on_finished=finished if o.decision_log is not None else None,
        index_knows_capacity=o.index_capacity == "exact",
        sink=keep,
        timeline_period_s=TIMELINE_PERIOD_S,
    )
    if o.progress is not None and source.total is not None:
        o.progress.start(source.total)
    sim.run(source.requests(cluster), o.rate_scale)
    return records, sim


def _load_predictor(predictor: str | Path | HitPredictor | None) -> HitPredictor | None:
    if predictor is None or not isinstance(predictor, str | Path):
        return predictor
    from router.predictor.persist import load_predictor

    return load_predictor(Path(predictor))


def run_replay(
    trace: str | Path | Sequence[TraceRequest],
    preset: str,
    policy: str | None = None,
    rate_scale: float = 1.0,
    seed: int = 0,
    *,
    policy_params: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    kv_event_delay_s: float = KV_EVENT_DELAY_S,
    kv_event_wan_delay_s: float = 0.0,
    sla: SlaThresholds | None = None,
    progress: ProgressObserver | None = None,
    decision_log: TextIO | None = None,
    index_mode: IndexMode = "events",
    predictor: str | Path | HitPredictor | None = None,
    index_capacity: IndexCapacity = "exact",
    trace_format: str | None = None,
    block_size: int | None = None,
    max_requests: int | None = None,
) -> ReplayResult:
    """Replay ``trace`` (a file, or requests) on the named preset with the named policy.

    ``policy`` defaults to the preset's; ``rate_scale`` 2 makes arrivals twice as fast;
    ``seed`` drives everything random (the WAN's bandwidth fluctuation); ``overrides``
    are dotted preset keys (``{"pools.md.instances": 8}``). Raises UserError for a bad
    name or an impossible cluster before anything runs.

    ``index_mode`` "approximate" sends no KV events: the scheduler records where it routed
    each request. ``predictor`` (a model file or a loaded model) turns index matches into
    predicted hits. With a ``decision_log`` each request's outcome is logged when it ends.
    ``index_capacity`` "unbounded" registers instances without their KV capacity: in
    approximate mode the index then remembers every route (it is told of no eviction).
    ``trace_format`` (default: detected) and ``block_size`` (convert the trace's block IDs
    to blocks of this many tokens) apply to a trace file. ``kv_event_wan_delay_s`` delays
    the KV events of instances outside the prefill pool's datacenter further (a router
    whose index hears the other datacenter's engines across the line).
    ``max_requests`` replays only the trace's first requests (in file order).
    """
    if rate_scale <= 0:
        raise UserError(f"--rate-scale must be positive, got {rate_scale}")
    if max_requests is not None and max_requests < 1:
        raise UserError(f"the number of requests must be positive, got {max_requests}")
    if kv_event_delay_s < 0:
        raise UserError(f"--kv-event-delay must be 0 or more, got {kv_event_delay_s}")
    if kv_event_wan_delay_s < 0:
        raise UserError(f"--kv-event-wan-delay must be 0 or more, got {kv_event_wan_delay_s}")
    if index_mode not in ("events", "approximate"):
        raise UserError(f"--index-mode must be events or approximate, got {index_mode!r}")
    if index_capacity not in ("exact", "unbounded"):
        raise UserError(f"--index-capacity must be exact or unbounded, got {index_capacity!r}")
    model = _load_predictor(predictor)
    sla = sla or SlaThresholds()
    cluster = load_preset(preset, overrides)
    policy_name = policy or cluster.spec.default_policy
    try:
        build_policy(parse_policy(policy_name, policy_params))  # a bad name: before the run
    except UnknownPolicyError as exc:
        raise UserError(str(exc)) from None
    source = _load_trace(
        trace, trace_format, block_size, count=progress is not None, max_requests=max_requests
    )
    # a streamed trace's requests are checked as they are read; its first one now, so a
    # cluster that cannot hold even that is refused before anything is built
    check_cluster(cluster, policy_name, source.held or [source.first])
    options = _RunOptions(
        policy_name, policy_params, rate_scale, seed, kv_event_delay_s, kv_event_wan_delay_s,
        progress, decision_log, index_mode, model, index_capacity,
    )  # fmt: skip

    started = time.perf_counter()
    try:
        records, sim = _simulate(cluster, source, options)
    except UnsortedTrace:  # a file not in arrival order: sort it in memory, start again
        if decision_log is not None:
            if not decision_log.seekable():
                raise UserError(
                    f"{source.name}: the trace is not sorted by arrival time and the decision "
                    "log cannot be rewritten; sort the trace first"
                ) from None
            decision_log.seek(0)
            decision_log.truncate()
        fmt = resolve_format(trace_format) if trace_format is not None else None
        checks = TraceChecks(source.name)
        held = list(
            itertools.islice(read_trace(source.name, fmt, block_size, checks=checks), max_requests)
        )
        source = _load_trace(held, name=source.name)
        source.checks = checks
        check_cluster(cluster, policy_name, source.held)
        records, sim = _simulate(cluster, source, options)
    warnings = cluster_warnings(cluster, policy_name, source.shape())
    trace_warning = source.checks.warning() if source.checks is not None else None
    warnings += [trace_warning] if trace_warning is not None else []
    wan = sim.cluster.wan
    wan_spec = cluster.spec.links.wan if wan is not None else None
    summary = summarize(
        records,
        policy=policy_name,
        preset=preset,
        trace=source.name,
        seed=seed,
        rate_scale=rate_scale,
        kv_event_delay_s=kv_event_delay_s,
        kv_event_wan_delay_s=kv_event_wan_delay_s,
        sla=sla,
        cost_per_hour=cluster.cost_per_hour(),
        wan_throughput=(wan.throughput_times, wan.throughput_rates) if wan is not None else None,
        wall_s=time.perf_counter() - started,
        index_mode=index_mode,
        cluster=cluster.resolved(),
        overrides=overrides,
        version=__version__,
        warnings=warnings,
        timeline=sim.timeline.samples if sim.timeline is not None else None,
        wan_bandwidth_gbps=wan_spec.bandwidth_gbps if wan_spec is not None else None,
        cost_split=cluster.cost_split(),
    )
    summary = summary.model_copy(update={"step_costs": sim.cluster.step_cost_sources})
    backlog = backlog_warning(summary, records)
    if backlog is not None:
        summary = summary.model_copy(update={"warnings": [*summary.warnings, backlog]})
    return ReplayResult(summary, records)

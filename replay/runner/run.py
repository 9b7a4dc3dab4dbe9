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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from policies.registry import UnknownPolicyError, build_policy, parse_policy
from replay.metrics.columns import RecordColumns
from replay.metrics.record import RequestRecord, record_fields
from replay.metrics.summary import ClusterFacts, Observed, RunSetup, Summary, summarize
from replay.metrics.writers import write_run
from replay.presets.cluster_preset import ClusterPreset
from replay.presets.loader import load_preset
from replay.runner.checks import backlog_warning, check_cluster, cluster_warnings
from replay.runner.config import IndexCapacity, IndexMode, ReplayConfig
from replay.runner.outcomes import outcome_of
from replay.runner.trace_source import (
    CheckedTrace,
    TraceShape,
    UnsortedTrace,
    count_requests,
)
from replay.sim.event_loop import EventLoop
from replay.sim.request_state import SimRequest
from replay.sim.sim_settings import ProgressObserver, SimHooks, SimSettings
from replay.sim.simulator import Simulator
from replay.trace.checks import TraceChecks
from replay.trace.formats import read_trace, resolve_format
from replay.trace.record import TraceRequest
from router import __version__
from router.errors import UserError
from router.index.memory_index import MemoryPrefixIndex
from router.scheduler import HitPredictor
from router.scheduler_factory import SchedulerFactory

__all__ = ["IndexCapacity", "IndexMode", "ReplayConfig", "ReplayResult", "run_replay"]

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
    strict: bool = False,
) -> _Trace:
    """A file's first request and a stream of the rest (``count``: the requests counted
    first, for a progress bar), or requests given in memory, sorted by arrival; only the
    first ``max_requests`` of them (in the file's or the sequence's order) when given.
    ``strict``: a file that contradicts itself is refused at its first contradiction."""
    if isinstance(trace, str | Path):
        fmt = resolve_format(trace_format) if trace_format is not None else None
        checks = TraceChecks(str(trace), strict=strict)
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
class _Run:
    """One run's configuration with what it holds at run time: the policy resolved, the
    progress bar, the decision log and the predictor loaded."""

    config: ReplayConfig
    policy: str
    progress: ProgressObserver | None
    decision_log: TextIO | None
    predictor: HitPredictor | None


def _simulate(cluster: ClusterPreset, source: _Trace, run: _Run) -> tuple[RecordColumns, Simulator]:
    """One run of the simulator over ``source``: each request's record as it ends."""
    c = run.config
    loop = EventLoop()
    schedulers = SchedulerFactory.create(
        MemoryPrefixIndex(clock=loop.clock),
        predictor=run.predictor,
        record_routes=c.index_mode == "approximate",
        decision_log=run.decision_log,
        clock=loop.clock,
    )
    scheduler = schedulers.build(build_policy(parse_policy(run.policy, c.policy_params)))
    records = RecordColumns()

    def finished(request: SimRequest) -> None:
        scheduler.record_outcome(outcome_of(request))

    def keep(request: SimRequest) -> None:
        records.put_fields(request.key, record_fields(request))

    settings = SimSettings(
        seed=c.seed, kv_event_delay_s=c.kv_event_delay_s,
        kv_event_wan_delay_s=c.kv_event_wan_delay_s, kv_events=c.index_mode == "events",
        index_knows_capacity=c.index_capacity == "exact", timeline_period_s=TIMELINE_PERIOD_S,
        step_cost_scale=c.step_cost_scale,
    )  # fmt: skip
    hooks = SimHooks(
        progress=run.progress,
        on_finished=finished if run.decision_log is not None else None,
        sink=keep,
    )
    sim = Simulator(
        cluster, scheduler, schedulers.index, block_size=source.first.block_size,
        settings=settings, hooks=hooks, loop=loop,
    )  # fmt: skip
    if run.progress is not None and source.total is not None:
        run.progress.start(source.total)
    sim.run(source.requests(cluster), c.rate_scale)
    return records, sim


def _load_predictor(path: str | None) -> HitPredictor | None:
    if path is None:
        return None
    from router.predictor.persist import load_predictor

    return load_predictor(Path(path))


def run_replay(
    config: ReplayConfig,
    *,
    requests: Sequence[TraceRequest] | None = None,
    progress: ProgressObserver | None = None,
    decision_log: TextIO | None = None,
) -> ReplayResult:
    """Replay ``config.trace`` (a file; or ``requests`` given in memory, ``config.trace``
    then their name) as ``config`` says (see ``ReplayConfig``'s fields). Raises UserError
    for a bad name or an impossible cluster before anything runs. With a ``decision_log``
    each request's outcome is logged when it ends; ``progress`` is told how many requests
    have finished."""
    cluster = load_preset(config.preset, config.overrides)
    policy = config.policy or cluster.spec.default_policy
    try:
        build_policy(parse_policy(policy, config.policy_params))  # a bad name: before the run
    except UnknownPolicyError as exc:
        raise UserError(str(exc)) from None
    run = _Run(config, policy, progress, decision_log, _load_predictor(config.predictor))
    trace: str | Sequence[TraceRequest] = config.trace if requests is None else requests
    source = _load_trace(
        trace, config.trace_format, config.block_size, count=progress is not None,
        name=config.trace, max_requests=config.max_requests, strict=config.strict_trace,
    )  # fmt: skip
    # a streamed trace's requests are checked as they are read; its first one now, so a
    # cluster that cannot hold even that is refused before anything is built
    check_cluster(cluster, policy, source.held or [source.first])
    started = time.perf_counter()
    try:
        records, sim = _simulate(cluster, source, run)
    except UnsortedTrace:  # a file not in arrival order: sort it in memory, start again
        source = _sorted_again(source, run)
        check_cluster(cluster, policy, source.held or [])
        records, sim = _simulate(cluster, source, run)
    summary = _summary(records, sim, cluster, source, run, time.perf_counter() - started)
    backlog = backlog_warning(summary, records)
    if backlog is not None:
        summary = summary.model_copy(update={"warnings": [*summary.warnings, backlog]})
    return ReplayResult(summary, records)


def _sorted_again(source: _Trace, run: _Run) -> _Trace:
    """A trace file found out of arrival order: read again, sorted in memory (the decision
    log so far emptied)."""
    log, c = run.decision_log, run.config
    if log is not None:
        if not log.seekable():
            raise UserError(
                f"{source.name}: the trace is not sorted by arrival time and the decision "
                "log cannot be rewritten; sort the trace first"
            ) from None
        log.seek(0)
        log.truncate()
    fmt = resolve_format(c.trace_format) if c.trace_format is not None else None
    checks = TraceChecks(source.name, strict=c.strict_trace)
    held = list(
        itertools.islice(read_trace(source.name, fmt, c.block_size, checks=checks), c.max_requests)
    )
    again = _load_trace(held, name=source.name)
    again.checks = checks
    return again


def _warnings(cluster: ClusterPreset, policy: str, source: _Trace) -> list[str]:
    """The cluster's warnings for this trace, and the trace's contradictions if any."""
    warnings = cluster_warnings(cluster, policy, source.shape())
    trace_warning = source.checks.warning() if source.checks is not None else None
    return warnings + ([trace_warning] if trace_warning is not None else [])


def _summary(
    records: RecordColumns,
    sim: Simulator,
    cluster: ClusterPreset,
    source: _Trace,
    run: _Run,
    wall_s: float,
) -> Summary:
    c = run.config
    wan = sim.cluster.wan
    wan_spec = cluster.spec.links.wan if wan is not None else None
    setup = RunSetup(
        policy=run.policy, preset=c.preset, trace=source.name, sla=c.sla, seed=c.seed,
        rate_scale=c.rate_scale, kv_event_delay_s=c.kv_event_delay_s,
        kv_event_wan_delay_s=c.kv_event_wan_delay_s, index_mode=c.index_mode,
        overrides=c.overrides, version=__version__, config=c.model_dump(mode="json"),
    )  # fmt: skip
    facts = ClusterFacts(
        cost_per_hour=cluster.cost_per_hour(), cost_split=cluster.cost_split(),
        resolved=cluster.resolved(),
        wan_bandwidth_gbps=wan_spec.bandwidth_gbps if wan_spec is not None else None,
    )  # fmt: skip
    observed = Observed(
        wall_s=wall_s,
        wan_throughput=(wan.throughput_times, wan.throughput_rates) if wan is not None else None,
        timeline=sim.timeline.samples if sim.timeline is not None else None,
        warnings=_warnings(cluster, run.policy, source),
    )
    summary = summarize(records, setup, facts, observed)
    return summary.model_copy(update={"step_costs": sim.cluster.step_cost_sources})

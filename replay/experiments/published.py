"""Replays of runs someone else measured on real engines: do the step costs predict them?

The shipped set (``replay/published/silicon.csv``) is NVIDIA's silicon benchmark sample
from AIConfigurator: closed-loop benchmarks of one engine (``agg``) or of a prefill and
a decode pool (``disagg``) at a fixed concurrency, every request with the same input and
output length, and their mean TTFT and TPOT. Each run is replayed here as it was
measured: one colocated engine of the run's GPU, model, quantization, tensor parallelism
and engine, or the run's prefill and decode pools of them in one datacenter
(``published_disagg``); ``concurrency`` clients each sending its next request when the
previous one ends, prompts that share no prefix.
The first round (one request per client) is left out: the means are over the steady
state that follows.

Nothing here is fitted: the step costs come from the preset's source (the database, or
the roofline for comparison) with the engine's defaults.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from policies.registry import build_policy, parse_policy
from replay.experiments.published_disagg import disagg_preset
from replay.experiments.published_run import PublishedRun
from replay.metrics.record import record_of
from replay.presets.cluster_preset import ClusterPreset
from replay.presets.loader import load_preset
from replay.sim.event_loop import EventLoop
from replay.sim.request_state import SimRequest
from replay.sim.sim_settings import SimHooks
from replay.sim.simulator import Simulator
from replay.sim.step_costs import StepCosts
from replay.trace.record import TraceRequest
from router.errors import UserError
from router.index.memory_index import MemoryPrefixIndex
from router.scheduler_factory import SchedulerFactory

__all__ = [
    "ClosedLoopResult",
    "PublishedRun",
    "closed_loop",
    "published_preset",
    "read_published",
    "replay_run",
]

BLOCK = 64  # tokens per block of the replayed prompts (no prefix is shared)
_FP8 = ("fp8", "fp8_block", "fp8_static")


class ClosedLoopResult(BaseModel):
    """The replay's means over its steady state, in milliseconds."""

    ttft_ms: float
    tpot_ms: float
    requests: int


def read_published(path: Path | None = None) -> list[PublishedRun]:
    """The runs of ``path`` (default: the shipped set), single-engine and disaggregated."""
    if path is None:
        text = resources.files("replay.published").joinpath("silicon.csv").read_text("utf-8")
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise UserError(f"cannot read {path}: {exc.strerror}") from None
    lines = text.splitlines()
    skipped = next((i for i, line in enumerate(lines) if not line.startswith("#")), 0)
    runs = []
    # numbered as in the file: the header is line skipped + 1
    for number, row in enumerate(csv.DictReader(lines[skipped:]), start=skipped + 2):
        try:
            runs.append(PublishedRun(**_cleaned(row)))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']} (got {e.get('input')!r})"
                for e in exc.errors()
            )
            raise UserError(f"{path or 'silicon.csv'} line {number}: {problems}") from None
    if not runs:
        raise UserError(f"{path or 'silicon.csv'} holds no run")
    return runs


def _cleaned(row: dict[str, str]) -> dict[str, Any]:
    return {key: (value if value != "" else None) for key, value in row.items() if key}


def published_preset(run: PublishedRun, source: str) -> ClusterPreset:
    """The run's deployment as it was measured, priced by ``source``: one colocated
    engine (agg), or a prefill and a decode pool in one datacenter (disagg)."""
    preset = disagg_preset(run, source) if run.mode == "disagg" else _agg_preset(run, source)
    if run.quant not in _FP8:
        return preset
    model = preset.model  # FP8 weights: a byte a parameter, FP8 GEMMs
    perfdb = model.perfdb.model_copy(update={"gemm_quant": run.quant}) if model.perfdb else None
    fp8 = model.model_copy(update={"weight_bytes_per_param": 1.0, "perfdb": perfdb})
    return dataclasses.replace(preset, model=fp8)


def _agg_preset(run: PublishedRun, source: str) -> ClusterPreset:
    if run.concurrency is None or run.tp is None:
        raise UserError(f"run {run.id}: a single-engine run needs concurrency and tp")
    overrides: dict[str, Any] = {
        "model": run.model,
        "pools.engines.instances": 1,
        "pools.engines.hardware": run.hardware,
        "pools.engines.gpus_per_instance": run.tp,
        "pools.engines.max_batch": max(run.concurrency, 256),
        "pools.engines.step_costs.source": source,
        "pools.engines.step_costs.engine": run.engine,
    }
    return load_preset("colocated-small", overrides)


def _requests(run: PublishedRun) -> Iterable[TraceRequest]:
    blocks = math.ceil(run.isl / BLOCK)
    key = 0
    while True:
        ids = tuple(range(key * blocks, (key + 1) * blocks))
        yield TraceRequest(key, 0.0, run.isl, run.osl, ids, BLOCK)
        key += 1


def _request_s(prefill: StepCosts, decode: StepCosts, batch: int, run: PublishedRun) -> float:
    """A request's time by the preset's own step costs, its prefill alone and its decode
    in a full batch: the clients start this far apart over one request's time, as a
    closed loop settles on an engine that mixes prefill into decode steps (as the
    replay's do). On one that prefills every waiting prompt first, clients that start
    together stay in step (``published_lockstep``)."""
    step = decode.decode_step_s(batch, batch * run.isl)
    return prefill.prefill_s([(run.isl, 0)]) + run.osl * step


def replay_run(run: PublishedRun, source: str, rounds: int = 4) -> ClosedLoopResult:
    """Replay ``run`` on its engine priced by ``source``, closed-loop."""
    return closed_loop(published_preset(run, source), run, rounds)


def closed_loop(preset: ClusterPreset, run: PublishedRun, rounds: int = 4) -> ClosedLoopResult:
    """``run``'s clients on ``preset``'s deployment, ``rounds`` requests each; the means
    over the requests sent after each client's first one that ended before the last was
    sent (the batch then only shrinks: the drain)."""
    concurrency = run.concurrency or 1
    total = concurrency * rounds
    loop = EventLoop()
    schedulers = SchedulerFactory.create(MemoryPrefixIndex(clock=loop.clock), clock=loop.clock)
    scheduler = schedulers.build(build_policy(parse_policy(preset.spec.default_policy)))
    fresh = iter(_requests(run))
    ended: list[SimRequest] = []
    drain_from = math.inf  # once the last request is sent, the batch only shrinks

    def next_request(request: SimRequest) -> None:
        nonlocal drain_from
        if request.rejected is not None:
            raise UserError(f"run {run.id}: the replay's engine refused a request")
        ended.append(request)
        if sim.arrived < total:
            sim.submit(next(fresh), loop.now)
            if sim.arrived == total:
                drain_from = loop.now

    sim = Simulator(
        preset,
        scheduler,
        schedulers.index,
        block_size=BLOCK,
        hooks=SimHooks(sink=next_request),
        loop=loop,
    )
    prefill = next(iter(sim.cluster.prefill.values())).step_costs
    decoders = list(sim.cluster.decode.values())  # none: the engine decodes what it prefills
    decode = decoders[0].step_costs if decoders else prefill
    batch = min(run.decode_batch or concurrency, concurrency)
    gap = _request_s(prefill, decode, batch, run) / concurrency
    first = [dataclasses.replace(next(fresh), arrival_s=i * gap) for i in range(concurrency)]
    sim.run(first)
    # steady state: after each client's first request, before the drain
    steady = [
        record_of(r)
        for r in ended
        if r.trace.request_id >= concurrency and (r.finished_s or math.inf) <= drain_from
    ]
    ttfts = [r.ttft_s for r in steady if r.ttft_s is not None]
    tpots = [r.tpot_s for r in steady if r.tpot_s is not None]
    if not ttfts or not tpots:
        raise UserError(f"run {run.id}: no request of the replay finished in steady state")
    return ClosedLoopResult(
        ttft_ms=1e3 * sum(ttfts) / len(ttfts),
        tpot_ms=1e3 * sum(tpots) / len(tpots),
        requests=len(steady),
    )

"""`replay plan`: the best PDD deployment for a trace, against the best of what teams run.

Three families are searched over the same budget: PDD (``plan_space``: pool sizes, GPUs,
line, policy thresholds), intra-DC PD and colocated engines (``baselines``). Every
deployment is priced and bounded (``plan_bounds``); one whose bound is below the target
rate (by default the trace's own rate) cannot serve the trace and is pruned. The rest are
measured by the same method, capacity at steady state (``capacity``, ``steady_replay``:
the trace tiled to a window past a warm-up at each rate):

1. **screen**: cheapest first, a batch per executor worker, one seed, a short window and
   a loose tolerance (``screen_tolerance``); a deployment whose bound is no higher than the
   capacity already measured for a cheaper one of its family is dominated and skipped,
   and one that fails at the target rate stops there (below the target);
2. **confirm**: the best BCR of each family (and its runner-up, when the screening put
   them within its tolerance) is measured again on the full window over every seed,
   bisected to ``tolerance``, with a 95% interval; the better is the family's best;
3. **sensitivity** (unless ``sensitivity`` is off, and when there is a baseline): each
   family's best measured again, on the first seed, under each change of
   ``plan_changes`` (the line's RTT, the step costs, the trace's hit-rate skew).

BCR is SLA goodput at capacity per 1000 USD/h. The Pareto front of
PDD's cost against capacity, the confirmed best of each family and the verdict
(``plan_verdict``, with its sensitivity rows) are the answer; ``plan_output`` writes and
prints it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from replay.experiments.baselines import Deployment, Family, baseline_deployments, deployment_of
from replay.experiments.capacity import CapacityResult, CapacitySettings, seed_capacity
from replay.experiments.capacity_job import CapacityJob, run_capacity_job
from replay.experiments.executor import Executor
from replay.experiments.plan_bounds import Bounds, TraceLoad, bounds_of
from replay.experiments.plan_changes import Remeasured, default_changes, remeasure
from replay.experiments.plan_space import (
    Candidate,
    Layout,
    PlanSpace,
    candidate_overrides,
    enumerate_candidates,
)
from replay.experiments.steady_replay import SteadyWindow
from replay.metrics.bcr import bcr_per_1000_usd_h
from replay.metrics.summary import SlaThresholds
from replay.presets.loader import load_preset
from replay.runner.config import ReplaySettings

__all__ = ["CandidateResult", "PlanResult", "PlanSettings", "run_plan", "screen_window_of"]

Status = Literal["confirmed", "screened", "pruned"]
Advance = Callable[[str, int, int], None]  # stage ("screening", "confirming"), done, total


def screen_window_of(window: SteadyWindow) -> SteadyWindow:
    """The screening's shorter window: half the warm-up, 40% of the window and tail."""
    return SteadyWindow(
        warmup_s=window.warmup_s / 2, window_s=window.window_s * 0.4, windows=4,
        tail_s=window.tail_s / 2,
    )  # fmt: skip


class PlanSettings(BaseModel):
    """What every measurement of the plan shares."""

    model_config = ConfigDict(frozen=True)

    trace: str
    preset: str
    policy: str
    replay: ReplaySettings = ReplaySettings()  # every replay's; its overrides on the preset
    seeds: tuple[int, ...] = (0, 1)
    target: float = 0.9
    tolerance: float = 0.02  # confirmation's bracket, relative
    screen_tolerance: float = 0.1
    max_probes: int = 14
    min_rate_scale: float = 1.0
    window: SteadyWindow = SteadyWindow()
    screen_window: SteadyWindow = screen_window_of(SteadyWindow())
    sensitivity: bool = True  # measure the bests again under plan_changes' changes

    @property
    def overrides(self) -> dict[str, Any]:
        return self.replay.overrides

    @property
    def sla(self) -> SlaThresholds:
        return self.replay.sla


class CandidateResult(BaseModel):
    """A deployment, its bounds, and its screening and confirmation (or why it was pruned)."""

    deployment: Deployment
    candidate: Candidate | None = None  # PDD's dimensions
    bounds: Bounds
    status: Status = "pruned"
    pruned_by: str | None = None  # memory, prefill, decode, line or dominated
    screen: CapacityResult | None = None
    confirmed: CapacityResult | None = None

    @property
    def family(self) -> Family:
        return self.deployment.family

    @property
    def label(self) -> str:
        return self.deployment.label

    @property
    def cost_usd_h(self) -> float:
        return self.deployment.cost_usd_h

    @property
    def result(self) -> CapacityResult | None:
        return self.confirmed if self.confirmed is not None else self.screen

    @property
    def capacity_req_s(self) -> float:
        return self.result.capacity_req_s if self.result is not None else 0.0

    @property
    def sla_goodput_req_s(self) -> float:
        return self.result.sla_goodput_req_s if self.result is not None else 0.0

    @property
    def screened_req_s(self) -> float:
        """The screening's capacity (every measured deployment has one, the same way)."""
        return self.screen.capacity_req_s if self.screen is not None else 0.0

    @property
    def screened_bcr_per_1000_usd_h(self) -> float:
        """The screening's BCR: its SLA goodput at capacity per 1000 USD/h."""
        good = self.screen.sla_goodput_req_s if self.screen is not None else 0.0
        return bcr_per_1000_usd_h(good, self.cost_usd_h)

    @property
    def bcr_per_1000_usd_h(self) -> float:
        """BCR: SLA goodput at capacity (req/s) per 1000 USD/h."""
        return bcr_per_1000_usd_h(self.sla_goodput_req_s, self.cost_usd_h)


class PlanResult(BaseModel):
    """Everything ``replay plan`` found."""

    settings: PlanSettings
    space: PlanSpace
    trace_rate_req_s: float
    target_rate_req_s: float
    results: list[CandidateResult]
    front: list[int]  # PDD results on the front, by cost
    best: dict[str, int]  # family -> index of its confirmed best
    remeasured: list[Remeasured] = []  # the bests under each change (sensitivity)

    def pruned_by(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            if r.pruned_by is not None:
                out[r.pruned_by] = out.get(r.pruned_by, 0) + 1
        return out

    def feasible(self, r: CandidateResult) -> bool:
        return r.status != "pruned" and r.capacity_req_s >= self.target_rate_req_s * (1 - 1e-6)

    def best_of(self, family: Family) -> CandidateResult | None:
        i = self.best.get(family)
        return None if i is None else self.results[i]


def _policy_word(name: str, params: Mapping[str, Any]) -> str:
    if not params:
        return name
    return name + ":" + ",".join(f"{k}={v}" for k, v in sorted(params.items()))


def _pdd(settings: PlanSettings, space: PlanSpace, load: TraceLoad) -> list[CandidateResult]:
    layout = Layout.of(load_preset(settings.preset, settings.overrides))
    out = []
    for c in enumerate_candidates(space):
        overrides = {
            **settings.overrides,
            **candidate_overrides(c, layout, space.wan_price_per_gbps_month),
        }
        policy = _policy_word(settings.policy, c.params)
        dep, preset = deployment_of("pdd", c.label, settings.preset, policy, overrides)
        bounds = bounds_of(
            preset, load, target=settings.target, sla=settings.sla,
            step_cost_scale=settings.replay.step_cost_scale,
        )  # fmt: skip
        out.append(CandidateResult(deployment=dep, candidate=c, bounds=bounds))
    return out


def _baselines(
    settings: PlanSettings, space: PlanSpace, load: TraceLoad, pdd: list[CandidateResult]
) -> list[CandidateResult]:
    costs = [r.cost_usd_h for r in pdd if r.bounds.memory_ok] or [r.cost_usd_h for r in pdd]
    base = load_preset(settings.preset, settings.overrides)
    found = baseline_deployments(
        base, settings.overrides, space.gpu_p, space.gpu_md, (min(costs), max(costs)), load,
        target=settings.target, sla=settings.sla, step_cost_scale=settings.replay.step_cost_scale,
    )  # fmt: skip
    return [CandidateResult(deployment=d, bounds=b) for d, b in found]


def _job(
    settings: PlanSettings, r: CandidateResult, capacity: CapacitySettings, window: SteadyWindow
) -> CapacityJob:
    d = r.deployment
    replay = settings.replay.model_copy(update={"overrides": dict(d.overrides)})
    return CapacityJob(trace=settings.trace, preset=d.preset, policy=d.policy,
                       settings=capacity, window=window, replay=replay)  # fmt: skip


def _screen_settings(
    settings: PlanSettings, target_rate: float, r: CandidateResult, measured: list[CandidateResult]
) -> CapacitySettings:
    """One seed, the loose tolerance; from the nearest-cost capacity measured in the family
    (a small step away), else from the target rate; a failure at the target rate ends it."""
    kin = [m for m in measured if m.family == r.family and m.capacity_req_s > 0]
    near = min(kin, key=lambda m: abs(m.cost_usd_h - r.cost_usd_h), default=None)
    start = max(target_rate, near.capacity_req_s) if near is not None else target_rate
    return CapacitySettings(
        target=settings.target, tolerance=settings.screen_tolerance,
        max_probes=settings.max_probes, seeds=settings.seeds[:1], start_req_s=start,
        step=1.5 if near is not None else 2.0, floor_req_s=target_rate,
    )  # fmt: skip


def _dominated(r: CandidateResult, measured: list[CandidateResult]) -> bool:
    """A cheaper (or equal) measured deployment of its family already serves its bound."""
    return any(
        m.family == r.family and m.cost_usd_h <= r.cost_usd_h and m.capacity_req_s >= r.bounds.rps
        for m in measured
    )


def _screen(
    settings: PlanSettings, results: list[CandidateResult], target_rate: float,
    executor: Executor, advance: Advance | None,
) -> None:  # fmt: skip
    queue = sorted(
        (r for r in results if r.pruned_by is None), key=lambda r: (r.cost_usd_h, -r.bounds.rps)
    )
    total, done = len(queue), 0
    measured: list[CandidateResult] = []
    while queue:
        batch: list[CandidateResult] = []
        while queue and len(batch) < executor.workers:
            r = queue.pop(0)
            if _dominated(r, measured):
                r.pruned_by = "dominated"
                done += 1
            else:
                batch.append(r)
        jobs = [
            _job(settings, r, _screen_settings(settings, target_rate, r, measured),
                 settings.screen_window)
            for r in batch
        ]  # fmt: skip
        for r, outcome in zip(batch, executor.map(run_capacity_job, jobs), strict=True):
            r.status, r.screen = "screened", outcome
            measured.append(r)
        done += len(batch)
        if advance is not None:
            advance("screening", done, total)


def _confirm(
    settings: PlanSettings, plan: PlanResult, executor: Executor, families: tuple[Family, ...],
    advance: Advance | None,
) -> None:  # fmt: skip
    """The best screened BCR of each family, and the runner-up when the screening cannot
    tell them apart (within its tolerance), measured again over every seed; the better
    confirmed BCR is the family's best."""
    picks: dict[Family, list[int]] = {}
    for family in families:
        kin = [i for i, r in enumerate(plan.results) if r.family == family and plan.feasible(r)]
        kin.sort(key=lambda i: (-plan.results[i].screened_bcr_per_1000_usd_h, i))
        if kin:
            top = plan.results[kin[0]].screened_bcr_per_1000_usd_h
            close = [i for i in kin[1:2] if plan.results[i].screened_bcr_per_1000_usd_h >= top * (
                1 - settings.screen_tolerance)]  # fmt: skip
            picks[family] = [kin[0], *close]
    chosen = [i for group in picks.values() for i in group]
    jobs = []
    for i in chosen:
        r = plan.results[i]
        capacity = CapacitySettings(
            target=settings.target, tolerance=settings.tolerance, max_probes=settings.max_probes,
            seeds=settings.seeds, start_req_s=r.capacity_req_s,
            step=1.0 + 2 * settings.screen_tolerance, floor_req_s=0.0,
        )  # fmt: skip
        jobs.append(_job(settings, r, capacity, settings.window))
    if advance is not None:
        advance("confirming", 0, len(jobs))
    for i, outcome in zip(chosen, executor.map(run_capacity_job, jobs), strict=True):
        plan.results[i].status, plan.results[i].confirmed = "confirmed", outcome
    best = {
        f: max(group, key=lambda i: (plan.results[i].bcr_per_1000_usd_h, -i))
        for f, group in picks.items()
    }
    plan.best = {str(f): i for f, i in best.items()}
    if advance is not None:
        advance("confirming", len(jobs), len(jobs))


def _front(plan: PlanResult) -> list[int]:
    """PDD deployments no other beats on both cost and screened capacity (the figure every
    one of them has), cheapest first; the best BCR is always on it."""
    target = plan.target_rate_req_s * (1 - 1e-6)
    ranked = sorted(
        (i for i, r in enumerate(plan.results)
         if r.family == "pdd" and r.screen is not None and r.screened_req_s >= target),
        key=lambda i: (plan.results[i].cost_usd_h, -plan.results[i].screened_req_s),
    )  # fmt: skip
    front: list[int] = []
    for i in ranked:
        if not front or plan.results[i].screened_req_s > plan.results[front[-1]].screened_req_s:
            front.append(i)
    return front


def _sensitivity(
    settings: PlanSettings, plan: PlanResult, executor: Executor, advance: Advance | None
) -> list[Remeasured]:
    """Each family's confirmed best under each change: its confirmation's search on the
    first seed alone, started from that seed's confirmed capacity."""
    seed = settings.seeds[0]
    jobs = {}
    for family, i in plan.best.items():
        r = plan.results[i]
        if r.confirmed is None:
            continue
        start = seed_capacity(r.confirmed, seed, settings.target)[0] or r.capacity_req_s
        capacity = CapacitySettings(
            target=settings.target, tolerance=settings.tolerance, max_probes=settings.max_probes,
            seeds=(seed,), start_req_s=max(start, 1e-3),
            step=1.0 + 2 * settings.screen_tolerance, floor_req_s=0.0,
        )  # fmt: skip
        jobs[family] = _job(settings, r, capacity, settings.window)
    if len(jobs) < 2:  # no baseline to compare with
        return []
    told = None if advance is None else lambda done, total: advance("sensitivity", done, total)
    return remeasure(jobs, default_changes(), executor, seed, told)


def run_plan(
    settings: PlanSettings,
    space: PlanSpace,
    load: TraceLoad,
    executor: Executor,
    *,
    baseline: bool = True,
    advance: Advance | None = None,
) -> PlanResult:
    """Price, bound, prune, screen and confirm PDD (and the baselines) on ``load``'s trace."""
    results = _pdd(settings, space, load)
    if baseline:
        results += _baselines(settings, space, load, results)
    target_rate = settings.min_rate_scale * load.rate_rps
    for r in results:
        if r.bounds.rps < target_rate:
            r.pruned_by = r.bounds.limit
    _screen(settings, results, target_rate, executor, advance)
    plan = PlanResult(
        settings=settings, space=space, trace_rate_req_s=load.rate_rps,
        target_rate_req_s=target_rate, results=results, front=[], best={},
    )  # fmt: skip
    families: tuple[Family, ...] = ("pdd", "intra-dc-pd", "colocated") if baseline else ("pdd",)
    _confirm(settings, plan, executor, families, advance)
    plan.front = _front(plan)
    if settings.sensitivity:
        plan.remeasured = _sensitivity(settings, plan, executor, advance)
    return plan

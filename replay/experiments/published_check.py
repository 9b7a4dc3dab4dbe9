"""How far replays of published runs land from their measurements, per set and source.

A set is the runs of one engine, model and GPU (``vllm/llama-3.1-70b/h200``), the
disaggregated ones apart (``sglang/qwen3-32b/h100 disagg``). For each
source of step costs and each metric (mean TTFT, mean TPOT, mean end-to-end latency,
the last ``TTFT + (osl - 1) x TPOT`` on both sides), the relative errors
(simulated - measured) / measured of the set's runs, summarized as their median
absolute value and the shares within 15% and 25%.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

from pydantic import BaseModel

from replay.experiments.published import ClosedLoopResult, PublishedRun, replay_run
from router.errors import UserError

__all__ = [
    "METRICS",
    "RunErrors",
    "SetSummary",
    "Unreplayed",
    "check_runs",
    "pick_runs",
    "set_name",
    "summarize_errors",
    "summarize_sets",
]

METRICS = ("ttft", "tpot", "e2e")


class RunErrors(BaseModel):
    """One run's replays against its measurement, by source."""

    run: PublishedRun
    simulated: dict[str, ClosedLoopResult]
    errors: dict[str, dict[str, float]]  # source -> metric -> relative error


class MetricSummary(BaseModel):
    median_abs_error: float
    within_15: float  # share of the runs
    within_25: float


class SetSummary(BaseModel):
    """One set's errors: source -> metric -> summary."""

    name: str
    mode: Literal["agg", "disagg"]
    runs: int
    by_source: dict[str, dict[str, MetricSummary]]


def set_name(run: PublishedRun) -> str:
    name = f"{run.engine}/{run.model}/{run.hardware}"
    return f"{name} disagg" if run.mode == "disagg" else name


def _e2e_ms(ttft_ms: float, tpot_ms: float, osl: int) -> float:
    return ttft_ms + (osl - 1) * tpot_ms


def _metrics(ttft_ms: float, tpot_ms: float, osl: int) -> dict[str, float]:
    return {"ttft": ttft_ms, "tpot": tpot_ms, "e2e": _e2e_ms(ttft_ms, tpot_ms, osl)}


def check_run(run: PublishedRun, sources: Sequence[str], rounds: int = 4) -> RunErrors:
    """Replay ``run`` under each source; its relative errors."""
    simulated = {source: replay_run(run, source, rounds) for source in sources}
    measured = _metrics(run.ttft_ms, run.tpot_ms, run.osl)
    errors = {}
    for source, sim in simulated.items():
        got = _metrics(sim.ttft_ms, sim.tpot_ms, run.osl)
        errors[source] = {m: (got[m] - measured[m]) / measured[m] for m in METRICS}
    return RunErrors(run=run, simulated=simulated, errors=errors)


def pick_runs(runs: Iterable[PublishedRun], per_set: int | None) -> list[PublishedRun]:
    """At most ``per_set`` runs of each set, spread evenly over its runs in file order
    (all of them when ``per_set`` is None)."""
    by_set: dict[str, list[PublishedRun]] = {}
    for run in runs:
        by_set.setdefault(set_name(run), []).append(run)
    picked: list[PublishedRun] = []
    for members in by_set.values():
        if per_set is None or len(members) <= per_set:
            picked.extend(members)
            continue
        step = len(members) / per_set
        picked.extend(members[int(i * step)] for i in range(per_set))
    return picked


class Unreplayed(BaseModel):
    """A run the replay could not price or finish, and why."""

    run: PublishedRun
    reason: str


def check_runs(
    runs: Sequence[PublishedRun],
    sources: Sequence[str],
    done: Callable[[int], None] | None = None,
) -> tuple[list[RunErrors], list[Unreplayed]]:
    """Every run checked (``done(n)`` after each); a run that cannot be replayed (its GPU,
    model or shape missing from a source) is set aside with its reason, not the end of the
    others."""
    checked, unreplayed = [], []
    for n, run in enumerate(runs, start=1):
        try:
            checked.append(check_run(run, sources))
        except UserError as exc:
            unreplayed.append(Unreplayed(run=run, reason=str(exc)))
        if done is not None:
            done(n)
    return checked, unreplayed


def summarize_errors(errors: list[float]) -> MetricSummary:
    """Median absolute relative error and the shares within 15% and 25%."""
    absolute = [abs(e) for e in errors]
    n = len(absolute)
    return MetricSummary(
        median_abs_error=statistics.median(absolute),
        within_15=sum(e <= 0.15 for e in absolute) / n,
        within_25=sum(e <= 0.25 for e in absolute) / n,
    )


def summarize_sets(checked: Sequence[RunErrors]) -> list[SetSummary]:
    """One summary per set, in the order the sets first appear."""
    by_set: dict[str, list[RunErrors]] = {}
    for item in checked:
        by_set.setdefault(set_name(item.run), []).append(item)
    out = []
    for name, items in by_set.items():
        sources = list(items[0].errors)
        by_source = {
            source: {m: summarize_errors([i.errors[source][m] for i in items]) for m in METRICS}
            for source in sources
        }
        mode = items[0].run.mode
        out.append(SetSummary(name=name, mode=mode, runs=len(items), by_source=by_source))
    return out

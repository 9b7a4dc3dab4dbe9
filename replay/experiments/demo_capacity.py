"""The demo's capacity figures: each deployment's capacity, SLA goodput at capacity and BCR.

At the trace's rate every deployment that copes meets the SLA and their BCRs differ by
cost alone; what tells deployments apart is how much each carries. The demo measures it
the way ``replay sweep`` and ``replay plan`` do (``replay.experiments.capacity`` over
``steady_replay``): the trace tiled to a steady state at each probed rate, a warm-up left
out, a window judged in parts, a bisection to 2% per seed, a 95% interval over seeds and
windows. The search starts at the rate the trace was replayed at and doubles or halves
from there; a deployment that fails at ``1 / FLOOR_DIVISOR`` of that rate stops there
(naive cross-DC PD collapses, and its search ends in a few small replays).

``capacity_rows`` turns the results into the table's three rows; ``capacity_note`` is
the sentence that says how they were measured; ``capacity_verdict`` compares PDD's BCR
at capacity with the others'.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from replay.experiments.capacity import CapacityResult, CapacitySettings
from replay.experiments.capacity_job import CapacityJob
from replay.experiments.steady_replay import SteadyWindow
from replay.metrics.bcr import bcr_per_1000_usd_h
from replay.runner.config import ReplaySettings

__all__ = [
    "CAPACITY_SEEDS",
    "CAPACITY_WINDOW",
    "FLOOR_DIVISOR",
    "bcr_at_capacity",
    "capacity_cell",
    "capacity_job",
    "capacity_note",
    "capacity_rows",
    "capacity_verdict",
]

CAPACITY_WINDOW = SteadyWindow()
"""``replay sweep``'s: 60 s of warm-up, 300 s judged in 5 parts, 30 s of tail."""

CAPACITY_SEEDS = 2
"""Seeds per search (``--seed`` and the next one), as ``replay sweep`` runs by default."""

FLOOR_DIVISOR = 16.0
"""A deployment failing at the trace's rate over this has its capacity below that rate."""


def capacity_job(
    trace: Path, preset: str, policy: str, *, start_req_s: float, settings: ReplaySettings
) -> CapacityJob:
    """The capacity search of ``preset`` under ``policy``, from ``start_req_s`` (the rate
    the trace was replayed at), over the seeds from ``settings.seed`` on."""
    rules = CapacitySettings(
        seeds=tuple(range(settings.seed, settings.seed + CAPACITY_SEEDS)),
        start_req_s=start_req_s, step=2.0, floor_req_s=start_req_s / FLOOR_DIVISOR,
    )  # fmt: skip
    return CapacityJob(trace=str(trace), preset=preset, policy=policy, settings=rules,
                       window=CAPACITY_WINDOW, replay=settings)  # fmt: skip


def bcr_at_capacity(result: CapacityResult, cost_usd_h: float) -> float:
    """SLA goodput at capacity per 1000 USD/h (0 for a cluster that costs nothing)."""
    return bcr_per_1000_usd_h(result.sla_goodput_req_s, cost_usd_h)


def capacity_cell(value: float, low: float, high: float, lowest_probe_req_s: float) -> str:
    """``value [low, high]`` in req/s, or ``< lowest`` when even the lowest probe failed."""
    if value <= 0:
        return f"< {lowest_probe_req_s:.2f}"
    return f"{value:.2f} [{low:.2f}, {high:.2f}]"


def capacity_rows(
    results: Sequence[CapacityResult], costs_usd_h: Sequence[float]
) -> list[tuple[str, list[str]]]:
    """The table's capacity rows, one cell per deployment (in the order given)."""
    lowest = [min((p.rate_req_s for p in r.probes), default=0.0) for r in results]
    return [
        ("capacity (req/s) [95% interval]", [
            capacity_cell(r.capacity_req_s, r.capacity_low_req_s, r.capacity_high_req_s, low)
            for r, low in zip(results, lowest, strict=True)
        ]),
        ("SLA goodput at capacity (req/s) [95% interval]", [
            capacity_cell(
                r.sla_goodput_req_s, r.sla_goodput_low_req_s, r.sla_goodput_high_req_s, low
            )
            for r, low in zip(results, lowest, strict=True)
        ]),
        ("BCR at capacity (req/s per 1000 USD/h)", [
            f"{bcr_at_capacity(r, c):.1f}" for r, c in zip(results, costs_usd_h, strict=True)
        ]),
    ]  # fmt: skip


def capacity_note(settings: CapacitySettings, window: SteadyWindow) -> str:
    """How the capacity rows were measured, in one sentence."""
    seeds = ", ".join(str(s) for s in settings.seeds)
    return (
        f"capacity: the highest arrival rate at which {settings.target:.0%} of requests meet "
        f"the SLA at steady state (the trace tiled, {window.warmup_s:g} s of warm-up left out, "
        f"{window.window_s:g} s judged in {window.windows} windows), bisected to "
        f"{settings.tolerance:.0%} from the trace's rate with at most {settings.max_probes} "
        f"probes per seed (seeds {seeds}), stopped below 1/{FLOOR_DIVISOR:g} of the trace's "
        "rate; the interval is 95% over seeds and windows; BCR at capacity is SLA goodput "
        "at capacity per 1000 USD/h"
    )


def capacity_verdict(labels: Sequence[str], bcrs: Sequence[float]) -> str:
    """The last deployment's (PDD's) BCR at capacity against each other one's."""
    *others, (label, mine) = zip(labels, bcrs, strict=True)
    parts = []
    for name, theirs in others:
        if theirs <= 0:
            parts.append(f"{name} serves nothing within the SLA")
        elif mine >= theirs * 2:
            parts.append(f"{mine / theirs:.1f}x {name}'s")
        else:
            parts.append(f"{mine / theirs - 1:+.1%} against {name}'s")
    return f"{label}: BCR at capacity {mine:.1f}, " + "; ".join(parts) + "."

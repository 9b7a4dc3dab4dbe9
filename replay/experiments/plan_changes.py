"""What the plan's verdict is re-measured under: the line's RTT, the step costs, the skew.

Prices do not change capacity, so the verdict's price rows reuse the confirmed figures;
these changes do, so the best deployment of each family is measured again under each
(``remeasure``), by the same capacity search as its confirmation but on one seed (the
plan's first) to keep the plan's time within reason. The reference they are read
against is that seed's own capacity in the confirmation (``seed_capacity``), measured
the same way before the change.

- **line RTT x2**: the WAN's round trip doubled (``links.wan.rtt_s``), and the line's
  one-way delay of KV events (``kv_event_wan_delay_s``, when set) with it. A deployment
  in one datacenter has no line: it is not measured again, its reference stands.
- **step costs x0.85 / x1.15**: every engine pass 15% cheaper or dearer
  (``ReplaySettings.step_cost_scale``), for every pool and step-cost source: what an
  error of that size on the simulator's step costs would change.
- **hit rates 85-95%**: the same trace with its hit-rate skew flattened
  (``replay.trace.flatten_hits``): every request's hit rate under an unbounded cache
  moved into the PDD report's narrow band, its arrivals and lengths unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Literal

from pydantic import BaseModel, ConfigDict

from replay.experiments.capacity import CapacityResult
from replay.experiments.capacity_job import CapacityJob, run_capacity_job
from replay.experiments.executor import Executor
from replay.presets.loader import load_preset
from replay.trace.flatten_hits import PAPER_BAND

__all__ = ["Change", "Remeasured", "changed_job", "default_changes", "remeasure"]

Kind = Literal["line_rtt", "step_costs", "hit_skew"]


class Change(BaseModel):
    """One change to measure the best deployments under: ``factor`` scales the line's
    RTT or the step costs; ``band`` is the hit-rate band of a flattened skew."""

    model_config = ConfigDict(frozen=True)

    kind: Kind
    factor: float = 1.0
    band: tuple[float, float] = PAPER_BAND

    @property
    def text(self) -> str:
        if self.kind == "line_rtt":
            return f"line RTT x{self.factor:g}"
        if self.kind == "step_costs":
            return f"step costs x{self.factor:g}"
        low, high = self.band
        return f"hit rates flattened to {low * 100:g}-{high:.0%}"


def default_changes() -> tuple[Change, ...]:
    return (
        Change(kind="line_rtt", factor=2.0),
        Change(kind="step_costs", factor=0.85),
        Change(kind="step_costs", factor=1.15),
        Change(kind="hit_skew"),
    )


class Remeasured(BaseModel):
    """The families' best measured again under one change; ``reused``: families the
    change leaves as they are (their reference stands)."""

    change: Change
    text: str  # the change in words, as the tables show it
    seed: int
    capacity: dict[str, CapacityResult]  # family -> its best's capacity under the change
    reused: list[str]


def changed_job(change: Change, job: CapacityJob) -> CapacityJob | None:
    """``job`` under ``change``; None when the change leaves the deployment as it is."""
    replay = job.replay
    if change.kind == "step_costs":
        return replace(job, replay=replay.model_copy(update={"step_cost_scale": change.factor}))
    if change.kind == "hit_skew":
        return replace(job, hit_band=change.band)
    preset = load_preset(job.preset, replay.overrides)
    wan = preset.spec.links.wan
    if wan is None or not preset.spans_datacenters():
        return None
    overrides = {**replay.overrides, "links.wan.rtt_s": wan.rtt_s * change.factor}
    delay = replay.kv_event_wan_delay_s * change.factor
    changed = replay.model_copy(update={"overrides": overrides, "kv_event_wan_delay_s": delay})
    return replace(job, replay=changed)


def remeasure(
    jobs: Mapping[str, CapacityJob], changes: tuple[Change, ...], executor: Executor, seed: int,
    advance: Callable[[int, int], None] | None = None,
) -> list[Remeasured]:  # fmt: skip
    """Each family's ``jobs`` (its best, one seed) again under each change, all at once;
    ``advance(done, total)`` is told as they end."""
    todo: list[tuple[int, str, CapacityJob]] = []
    out = []
    for i, change in enumerate(changes):
        reused = []
        for family, job in jobs.items():
            changed = changed_job(change, job)
            if changed is None:
                reused.append(family)
            else:
                todo.append((i, family, changed))
        text = change.text
        if change.kind == "line_rtt":
            text += _rtt_words(jobs, change.factor)
        out.append(Remeasured(change=change, text=text, seed=seed, capacity={}, reused=reused))
    total = len(todo)
    on_done = None if advance is None else lambda done: advance(done, total)
    found = executor.map(run_capacity_job, [job for _, _, job in todo], on_done=on_done)
    for (i, family, _), result in zip(todo, found, strict=True):
        out[i].capacity[family] = result
    return out


def _rtt_words(jobs: Mapping[str, CapacityJob], factor: float) -> str:
    """`` (30 -> 60 ms)``: the PDD deployment's line's RTT before and after."""
    job = jobs.get("pdd")
    wan = load_preset(job.preset, job.replay.overrides).spec.links.wan if job else None
    if wan is None:
        return ""
    return f" ({wan.rtt_s * 1e3:g} -> {wan.rtt_s * factor * 1e3:g} ms)"

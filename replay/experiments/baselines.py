"""The deployments `replay plan` holds PDD against: intra-DC PD and colocated engines.

Both families are searched over the same budget as the PDD candidates (from the cheapest
to the dearest of them) and with the same GPU kinds per role: intra-DC PD (``idc-pd-small``
pools) with a prefill GPU of PDD's prefill kinds and a decode GPU of PDD's MD kinds, every
instance count whose cost lies in the budget, and per total count and GPU pair the two
P:D splits the bounds favour; colocated engines (``colocated-small``, each engine both
prefills and decodes) of any of PDD's GPU kinds, every count in the budget. The model,
timing, handoff and hardware of the base preset (its ``--set`` keys of those) carry over.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from replay.experiments.plan_bounds import Bounds, TraceLoad, bounds_of
from replay.metrics.summary import SlaThresholds
from replay.presets.cluster_preset import ClusterPreset
from replay.presets.loader import load_preset

Bound = Callable[[ClusterPreset], Bounds]
"""A deployment's bounds on the plan's trace, SLA and target."""

__all__ = [
    "COLOCATED_PRESET",
    "IDC_PRESET",
    "Deployment",
    "Family",
    "baseline_deployments",
    "deployment_of",
]

Family = Literal["pdd", "intra-dc-pd", "colocated"]
IDC_PRESET = "idc-pd-small"
COLOCATED_PRESET = "colocated-small"
_SHARED_PREFIXES = ("timing.", "handoff.", "hardware.", "models.")  # --set keys baselines get
_MOST_INSTANCES = 64


class Deployment(BaseModel):
    """One deployment to measure: its family, preset and overrides, policy and prices."""

    model_config = ConfigDict(frozen=True)

    family: Family
    label: str
    preset: str
    policy: str  # NAME or NAME:k=v,...
    overrides: dict[str, Any]
    cost_usd_h: float
    line_usd_h: float

    @property
    def gpu_usd_h(self) -> float:
        return self.cost_usd_h - self.line_usd_h


def deployment_of(
    family: Family, label: str, preset: str, policy: str, overrides: Mapping[str, Any]
) -> tuple[Deployment, ClusterPreset]:
    """The deployment and its resolved preset (for the bounds)."""
    resolved = load_preset(preset, overrides)
    split = resolved.cost_split()
    deployment = Deployment(
        family=family, label=label, preset=preset, policy=policy, overrides=dict(overrides),
        cost_usd_h=resolved.cost_per_hour(), line_usd_h=split.get("wan", 0.0),
    )  # fmt: skip
    return deployment, resolved


def _shared(base: ClusterPreset, overrides: Mapping[str, Any]) -> dict[str, Any]:
    shared = {k: v for k, v in overrides.items() if k.startswith(_SHARED_PREFIXES)}
    return {**shared, "model": base.spec.model}


def _idc(
    shared: dict[str, Any], gpus_p: Sequence[str], gpus_d: Sequence[str],
    budget: tuple[float, float], bound: Bound,
) -> list[tuple[Deployment, Bounds]]:  # fmt: skip
    groups: dict[tuple[int, str, str], list[tuple[Deployment, Bounds]]] = {}
    for gp, gd, p in itertools.product(gpus_p, gpus_d, range(1, _MOST_INSTANCES)):
        for d in range(1, _MOST_INSTANCES):
            overrides = {
                **shared, "pools.p.instances": p, "pools.p.hardware": gp,
                "pools.md.instances": d, "pools.md.hardware": gd,
            }  # fmt: skip
            label = f"intra-DC PD: P {p}x{gp} + D {d}x{gd}"
            dep, preset = deployment_of("intra-dc-pd", label, IDC_PRESET, "idc-pd", overrides)
            if dep.cost_usd_h > budget[1]:
                break  # more decode instances only cost more
            if dep.cost_usd_h >= budget[0]:
                bounds = bound(preset)
                groups.setdefault((p + d, gp, gd), []).append((dep, bounds))
    out = []
    for group in groups.values():  # the two splits of each size the bounds favour
        group.sort(key=lambda item: (-item[1].rps, item[0].cost_usd_h))
        out.extend(group[:2])
    return out


def _colocated(
    shared: dict[str, Any], gpus: Sequence[str], budget: tuple[float, float], bound: Bound,
) -> list[tuple[Deployment, Bounds]]:  # fmt: skip
    out = []
    for gpu in gpus:
        for n in range(1, _MOST_INSTANCES):
            overrides = {**shared, "pools.engines.instances": n, "pools.engines.hardware": gpu}
            label = f"colocated: {n}x{gpu}"
            dep, preset = deployment_of(
                "colocated", label, COLOCATED_PRESET, "colocated", overrides
            )
            if dep.cost_usd_h > budget[1]:
                break
            if dep.cost_usd_h >= budget[0]:
                out.append((dep, bound(preset)))
    return out


def baseline_deployments(
    base: ClusterPreset,
    base_overrides: Mapping[str, Any],
    gpus_p: Sequence[str],
    gpus_d: Sequence[str],
    budget: tuple[float, float],
    load: TraceLoad,
    *,
    target: float,
    sla: SlaThresholds,
    step_cost_scale: float = 1.0,
) -> list[tuple[Deployment, Bounds]]:
    """Intra-DC PD and colocated deployments within ``budget`` (USD/h, inclusive), their
    bounds priced with every engine pass ``step_cost_scale`` times as long."""
    shared = _shared(base, base_overrides)
    kinds = list(dict.fromkeys([*gpus_p, *gpus_d]))
    bound = partial(bounds_of, load=load, target=target, sla=sla, step_cost_scale=step_cost_scale)
    return [
        *_idc(shared, gpus_p, gpus_d, budget, bound),
        *_colocated(shared, kinds, budget, bound),
    ]

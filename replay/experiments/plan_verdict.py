"""The verdict of `replay plan`: PDD's confirmed best against each baseline family's best.

For each baseline the BCR ratio (PDD's over the baseline's) is given with an interval
from the ends of the two SLA goodput intervals (PDD's low over the baseline's high, and
the reverse: wider than a joint interval, never narrower), and split into three factors
whose product it is:

- **goodput**: PDD's SLA goodput at capacity over the baseline's;
- **hardware**: the baseline's cost over PDD's GPUs' cost (above 1: PDD's GPUs cost less);
- **line**: PDD's GPUs' cost over its whole cost (below 1: what the line costs it).

The sensitivity rows say how the ratios move. The price rows (the line's price, the
H200's premium over the H100) reuse the confirmed capacities: capacity does not depend
on price. The measured rows (``plan_changes``: the line's RTT, the step costs, the
trace's hit-rate skew) take each family's best measured again under the change on the
plan's first seed; they are read against the reference row, that seed's capacities in
the confirmation, at the deployments' own prices. A family a change leaves as it is
(no line, for the RTT) keeps its reference.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from replay.experiments.baselines import Family
from replay.experiments.capacity import seed_capacity
from replay.experiments.plan import CandidateResult, PlanResult
from replay.presets.loader import load_preset

__all__ = ["Comparison", "Sensitivity", "comparisons", "measured_sensitivity", "sensitivity"]

LINE_FACTORS = (0.5, 2.0, 4.0)
H200_PREMIUMS = (0.0, 0.5)  # over the H100's price per GPU-hour


class Comparison(BaseModel):
    """PDD's best against one baseline family's best."""

    baseline: str  # family
    pdd_label: str
    baseline_label: str
    pdd_cost_usd_h: float
    baseline_cost_usd_h: float
    pdd_sla_goodput_req_s: float
    pdd_sla_goodput_low_req_s: float
    pdd_sla_goodput_high_req_s: float
    baseline_sla_goodput_req_s: float
    baseline_sla_goodput_low_req_s: float
    baseline_sla_goodput_high_req_s: float
    bcr_ratio: float
    bcr_ratio_low: float
    bcr_ratio_high: float
    sla_goodput_factor: float
    hardware_factor: float
    line_factor: float

    @property
    def decided(self) -> bool:
        """The interval of the ratio leaves out 1: one is better, not a tie."""
        return self.bcr_ratio_low > 1.0 or self.bcr_ratio_high < 1.0


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")


def _compare(pdd: CandidateResult, base: CandidateResult) -> Comparison | None:
    p, b = pdd.confirmed, base.confirmed
    if p is None or b is None or b.sla_goodput_req_s <= 0:
        return None
    pc, bc = pdd.cost_usd_h, base.cost_usd_h
    gpu = pdd.deployment.gpu_usd_h
    return Comparison(
        baseline=base.family, pdd_label=pdd.label, baseline_label=base.label,
        pdd_cost_usd_h=round(pc, 6), baseline_cost_usd_h=round(bc, 6),
        pdd_sla_goodput_req_s=p.sla_goodput_req_s,
        pdd_sla_goodput_low_req_s=p.sla_goodput_low_req_s,
        pdd_sla_goodput_high_req_s=p.sla_goodput_high_req_s,
        baseline_sla_goodput_req_s=b.sla_goodput_req_s,
        baseline_sla_goodput_low_req_s=b.sla_goodput_low_req_s,
        baseline_sla_goodput_high_req_s=b.sla_goodput_high_req_s,
        bcr_ratio=round(_ratio(p.sla_goodput_req_s * bc, b.sla_goodput_req_s * pc), 6),
        bcr_ratio_low=round(
            _ratio(p.sla_goodput_low_req_s * bc, b.sla_goodput_high_req_s * pc), 6
        ),
        bcr_ratio_high=round(
            _ratio(p.sla_goodput_high_req_s * bc, b.sla_goodput_low_req_s * pc), 6
        ),
        sla_goodput_factor=round(_ratio(p.sla_goodput_req_s, b.sla_goodput_req_s), 6),
        hardware_factor=round(_ratio(bc, gpu), 6),
        line_factor=round(_ratio(gpu, pc), 6),
    )  # fmt: skip


def comparisons(plan: PlanResult) -> list[Comparison]:
    """PDD's best against each baseline family's best that was confirmed."""
    pdd = plan.best_of("pdd")
    if pdd is None:
        return []
    out = []
    families: tuple[Family, ...] = ("intra-dc-pd", "colocated")
    for family in families:
        base = plan.best_of(family)
        found = _compare(pdd, base) if base is not None else None
        if found is not None:
            out.append(found)
    return out


class Sensitivity(BaseModel):
    """The BCR ratios against each baseline under a change: of a price (``kind``
    price), or measured again on ``seed`` (``kind`` measured; the reference row is the
    confirmation's own figures for that seed), with each family's SLA goodput."""

    change: str
    kind: Literal["price", "measured"] = "price"
    bcr_ratio: dict[str, float]  # baseline family -> ratio
    seed: int | None = None
    sla_goodput_at_capacity_req_s: dict[str, float] = {}  # family -> (measured rows)
    reused: list[str] = []  # families the change leaves as they are: reference kept


def _cost(r: CandidateResult, line_factor: float, h200_premium: float | None) -> float:
    preset = load_preset(r.deployment.preset, r.deployment.overrides)
    total = r.deployment.line_usd_h * line_factor
    h100 = preset.hardware["h100"].price_per_hour if "h100" in preset.hardware else None
    for kind, n in preset.gpu_counts().items():
        price = preset.hardware[kind].price_per_hour
        if kind == "h200" and h200_premium is not None and h100 is not None:
            price = h100 * (1.0 + h200_premium)
        total += n * price
    return total


def _measured_row(
    change: str, goodput: dict[str, float], costs: dict[str, float], seed: int,
    reused: list[str],
) -> Sensitivity:  # fmt: skip
    pdd_bcr = goodput["pdd"] / costs["pdd"]
    ratios = {
        f: round(pdd_bcr / (g / costs[f]), 6) for f, g in goodput.items() if f != "pdd" and g > 0
    }
    return Sensitivity(
        change=change, kind="measured", bcr_ratio=ratios, seed=seed,
        sla_goodput_at_capacity_req_s={f: round(g, 6) for f, g in goodput.items()},
        reused=reused,
    )  # fmt: skip


def measured_sensitivity(plan: PlanResult) -> list[Sensitivity]:
    """The reference row (the first seed's confirmed figures), then a row per change
    measured again (``plan.remeasured``); none when nothing was."""
    if not plan.remeasured:
        return []
    seed = plan.remeasured[0].seed
    reference: dict[str, float] = {}
    costs: dict[str, float] = {}
    for family, i in plan.best.items():
        r = plan.results[i]
        if r.confirmed is not None:
            reference[family] = seed_capacity(r.confirmed, seed, plan.settings.target)[1]
            costs[family] = r.cost_usd_h
    if "pdd" not in reference:
        return []
    rows = [_measured_row(f"as confirmed, seed {seed} alone", reference, costs, seed, [])]
    for m in plan.remeasured:
        goodput = {f: m.capacity[f].sla_goodput_req_s if f in m.capacity else g
                   for f, g in reference.items()}  # fmt: skip
        rows.append(_measured_row(m.text, goodput, costs, seed, list(m.reused)))
    return rows


def sensitivity(plan: PlanResult) -> list[Sensitivity]:
    """BCR ratios with the line's price scaled and with other H200 premiums, then the
    measured rows (``measured_sensitivity``)."""
    pdd = plan.best_of("pdd")
    bases = [c for c in (plan.best_of("intra-dc-pd"), plan.best_of("colocated")) if c]
    if pdd is None or pdd.confirmed is None or not bases:
        return []
    changes: list[tuple[str, float, float | None]] = [
        (f"line price x{f:g}", f, None) for f in LINE_FACTORS
    ]
    changes += [(f"H200 premium {p:.0%} over H100", 1.0, p) for p in H200_PREMIUMS]
    out = []
    for text, line, premium in changes:
        ratios = {}
        for base in bases:
            if base.confirmed is None or base.confirmed.sla_goodput_req_s <= 0:
                continue
            pdd_bcr = pdd.confirmed.sla_goodput_req_s / _cost(pdd, line, premium)
            base_bcr = base.confirmed.sla_goodput_req_s / _cost(base, line, premium)
            ratios[base.family] = round(pdd_bcr / base_bcr, 6)
        out.append(Sensitivity(change=text, bcr_ratio=ratios))
    return out + measured_sensitivity(plan)

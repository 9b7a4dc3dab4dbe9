"""`replay plan`'s baselines over PDD's budget, and the verdict's arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from replay.experiments.baselines import baseline_deployments, deployment_of
from replay.experiments.capacity import CapacityResult
from replay.experiments.plan import CandidateResult, PlanResult, PlanSettings
from replay.experiments.plan_bounds import Bounds, TraceLoad
from replay.experiments.plan_output import limit_shown
from replay.experiments.plan_space import PlanSpace
from replay.experiments.plan_verdict import comparisons, sensitivity
from replay.metrics.summary import SlaThresholds
from replay.presets.loader import load_preset

LOAD = TraceLoad(
    duration_s=100.0,
    input_tokens=np.full(100, 10_000.0),
    output_tokens=np.full(100, 101.0),
    hit_tokens=np.full(100, 9_000.0),
)


def test_baselines_stay_within_the_budget_and_keep_two_splits_per_size() -> None:
    found = baseline_deployments(
        load_preset("pdd-small"), {}, ["h100"], ["h200"], (80.0, 130.0), LOAD,
        target=0.9, sla=SlaThresholds(),
    )  # fmt: skip
    assert found
    assert all(80.0 <= d.cost_usd_h <= 130.0 for d, _ in found)
    idc = [d for d, _ in found if d.family == "intra-dc-pd"]
    colocated = [d for d, _ in found if d.family == "colocated"]
    # H100 prefill at 20 USD/h, H200 decode at 25: sizes 4 (85, 90, ...) to 6 (125, 130)
    sizes: dict[int, int] = {}
    for d in idc:
        n = d.overrides["pools.p.instances"] + d.overrides["pools.md.instances"]
        sizes[n] = sizes.get(n, 0) + 1
    assert set(sizes) == {4, 5, 6}
    assert max(sizes.values()) == 2
    # colocated engines of H100 (20 USD/h: 4 to 6) and of H200 (25 USD/h: 4 and 5)
    assert sorted(d.label for d in colocated) == [
        "colocated: 4xh100", "colocated: 4xh200", "colocated: 5xh100", "colocated: 5xh200",
        "colocated: 6xh100",
    ]  # fmt: skip
    assert all(d.line_usd_h == 0.0 for d, _ in found)


def test_a_colocated_engine_is_bounded_as_prefill_and_decode() -> None:
    found = baseline_deployments(
        load_preset("pdd-small"), {}, ["h100"], ["h100"], (40.0, 40.0), LOAD,
        target=0.9, sla=SlaThresholds(),
    )  # fmt: skip
    bounds = {d.label: b for d, b in found}
    coloc = bounds["colocated: 2xh100"]
    idc = bounds["intra-DC PD: P 1xh100 + D 1xh100"]
    assert coloc.decode_rps > 0  # it decodes: not pruned by a decode bound of 0
    assert coloc.prefill_rps == pytest.approx(2 * idc.prefill_rps, rel=0.2)


def _capacity(goodput: float, low: float, high: float) -> CapacityResult:
    return CapacityResult(
        capacity_req_s=goodput, capacity_low_req_s=low, capacity_high_req_s=high,
        sla_goodput_req_s=goodput, sla_goodput_low_req_s=low, sla_goodput_high_req_s=high,
        per_seed_req_s=[goodput], bracketed=True, monotone=True, probes=[], warnings=[],
    )  # fmt: skip


def _result(family: str, preset: str, policy: str, got: CapacityResult) -> CandidateResult:
    dep, _ = deployment_of(family, f"{family}: x", preset, policy, {})  # type: ignore[arg-type]
    bounds = Bounds(prefill_rps=100.0, decode_rps=20.0, line_rps=1e9, memory_ok=True)
    return CandidateResult(deployment=dep, bounds=bounds, status="confirmed", confirmed=got)


def test_the_verdict_splits_the_bcr_ratio_into_goodput_hardware_and_line() -> None:
    pdd = _result("pdd", "pdd-small", "pdd-adaptive", _capacity(12.0, 11.0, 13.0))
    idc = _result("intra-dc-pd", "idc-pd-small", "idc-pd", _capacity(10.0, 9.5, 10.5))
    space = PlanSpace(
        p=(3,), rld=(1,), md=(2,), gpu_p=("h100",), gpu_rld=("h100",), gpu_md=("h200",),
        wan_gbps=(20.0,), wan_price_per_gbps_month=72.4,
    )  # fmt: skip
    plan = PlanResult(
        settings=PlanSettings(trace="t", preset="pdd-small", policy="pdd-adaptive"),
        space=space, trace_rate_req_s=5.0, target_rate_req_s=5.0, results=[pdd, idc],
        front=[0], best={"pdd": 0, "intra-dc-pd": 1},
    )  # fmt: skip
    (c,) = comparisons(plan)
    # pdd-small: 119.48 USD/h of which 1.98 is the line; idc-pd-small: 120 USD/h
    assert c.bcr_ratio == pytest.approx((12.0 / 119.4836) / (10.0 / 120.0), rel=1e-4)
    assert c.bcr_ratio == pytest.approx(c.sla_goodput_factor * c.hardware_factor * c.line_factor)
    assert c.hardware_factor == pytest.approx(120.0 / 117.5)
    assert c.bcr_ratio_low == pytest.approx((11.0 / 119.4836) / (10.5 / 120.0), rel=1e-4)
    assert c.bcr_ratio_low > 1  # PDD's worst over the baseline's best still wins
    assert c.decided
    rows = {s.change: s.bcr_ratio["intra-dc-pd"] for s in sensitivity(plan)}
    # H200 at the H100's price: PDD's 16 MD GPUs cost 40 USD/h instead of 50
    assert rows["H200 premium 0% over H100"] == pytest.approx(
        (12.0 / 109.4836) / (10.0 / 120.0), rel=1e-4
    )
    assert rows["line price x2"] < c.bcr_ratio < rows["line price x0.5"]
    # the decode bound (20 req/s) is within 2x of the capacity (12): named the limit
    assert limit_shown(pdd) == "decode"
    far = pdd.model_copy(update={"bounds": Bounds(
        prefill_rps=100.0, decode_rps=100.0, line_rps=1e9, memory_ok=True
    )})  # fmt: skip
    assert limit_shown(far) is None  # a bound 8x the capacity is not the limit

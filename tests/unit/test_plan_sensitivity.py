"""The verdict's sensitivity: the changes measured again, and the rows read from them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from replay.experiments.baselines import deployment_of
from replay.experiments.capacity import (
    CapacityProbe,
    CapacityResult,
    CapacitySettings,
    WindowedAttainment,
)
from replay.experiments.capacity_job import CapacityJob
from replay.experiments.plan import CandidateResult, PlanResult, PlanSettings
from replay.experiments.plan_bounds import Bounds
from replay.experiments.plan_changes import Change, Remeasured, changed_job
from replay.experiments.plan_output import plan_json, sensitivity_table
from replay.experiments.plan_space import PlanSpace
from replay.experiments.plan_verdict import sensitivity
from replay.experiments.steady_replay import SteadyWindow
from replay.report.plan_report import render_plan_report
from replay.runner.config import ReplaySettings

PDD_USD_H = 117.5 + 20 * 72.4 / 730  # pdd-small: its GPUs and a 20 Gbps line
IDC_USD_H = 120.0  # idc-pd-small
COLOCATED_USD_H = 120.0  # colocated-small


def _probe(seed: int, rate: float, attainment: float) -> CapacityProbe:
    windows = WindowedAttainment(met=(round(attainment * 100),), total=(100,))
    return CapacityProbe(
        seed=seed, rate_req_s=rate, attainment=attainment, passed=attainment >= 0.9,
        windows=windows,
    )  # fmt: skip


def _capacity(goodput: float, probes: list[CapacityProbe] | None = None) -> CapacityResult:
    return CapacityResult(
        capacity_req_s=goodput, capacity_low_req_s=goodput, capacity_high_req_s=goodput,
        sla_goodput_req_s=goodput, sla_goodput_low_req_s=goodput,
        sla_goodput_high_req_s=goodput,
        per_seed_req_s=[goodput], bracketed=True, monotone=True, probes=probes or [],
        warnings=[],
    )  # fmt: skip


def _best(family: str, preset: str, policy: str, per_seed: dict[int, float]) -> CandidateResult:
    """Confirmed over two seeds: each seed passes at its capacity (every request within
    the SLA) and fails 5% above it."""
    probes = [p for s, c in per_seed.items() for p in (_probe(s, c, 1.0), _probe(s, c * 1.05, 0.5))]
    got = _capacity(sum(per_seed.values()) / len(per_seed), probes)
    dep, _ = deployment_of(family, f"{family}: x", preset, policy, {})  # type: ignore[arg-type]
    bounds = Bounds(prefill_rps=100.0, decode_rps=100.0, line_rps=1e9, memory_ok=True)
    return CandidateResult(deployment=dep, bounds=bounds, status="confirmed", confirmed=got)


def _plan(remeasured: list[Remeasured]) -> PlanResult:
    space = PlanSpace(
        p=(3,), rld=(1,), md=(2,), gpu_p=("h100",), gpu_rld=("h100",), gpu_md=("h200",),
        wan_gbps=(20.0,), wan_price_per_gbps_month=72.4,
    )  # fmt: skip
    results = [
        _best("pdd", "pdd-small", "pdd-adaptive", {0: 12.0, 1: 14.0}),
        _best("intra-dc-pd", "idc-pd-small", "idc-pd", {0: 10.0, 1: 11.0}),
        _best("colocated", "colocated-small", "colocated", {0: 6.0, 1: 6.0}),
    ]
    return PlanResult(
        settings=PlanSettings(trace="t", preset="pdd-small", policy="pdd-adaptive"),
        space=space, trace_rate_req_s=5.0, target_rate_req_s=5.0, results=results,
        front=[], best={"pdd": 0, "intra-dc-pd": 1, "colocated": 2}, remeasured=remeasured,
    )  # fmt: skip


def _ratio(pdd: float, base: float, base_usd_h: float) -> float:
    return (pdd / PDD_USD_H) / (base / base_usd_h)


def test_measured_rows_read_each_change_against_the_first_seeds_own_figures() -> None:
    rtt = Remeasured(
        change=Change(kind="line_rtt", factor=2.0), text="line RTT x2 (30 -> 60 ms)", seed=0,
        capacity={"pdd": _capacity(9.0)}, reused=["intra-dc-pd", "colocated"],
    )  # fmt: skip
    slow = Remeasured(
        change=Change(kind="step_costs", factor=1.15), text="step costs x1.15", seed=0,
        capacity={"pdd": _capacity(10.5), "intra-dc-pd": _capacity(8.0),
                  "colocated": _capacity(5.0)},
        reused=[],
    )  # fmt: skip
    rows = {r.change: r for r in sensitivity(_plan([rtt, slow]))}
    assert [r.kind for r in rows.values()].count("price") == 5
    # the reference: seed 0's capacities (12, 10, 6), not the means over seeds (13, 10.5, 6)
    ref = rows["as confirmed, seed 0 alone"]
    assert ref.kind == "measured"
    assert ref.seed == 0
    assert ref.sla_goodput_at_capacity_req_s == {"pdd": 12.0, "intra-dc-pd": 10.0, "colocated": 6.0}
    assert ref.bcr_ratio["intra-dc-pd"] == pytest.approx(_ratio(12, 10, IDC_USD_H), rel=1e-5)
    # the RTT leaves the baselines (no line) at their reference
    row = rows["line RTT x2 (30 -> 60 ms)"]
    assert row.reused == ["intra-dc-pd", "colocated"]
    assert row.sla_goodput_at_capacity_req_s == {"pdd": 9.0, "intra-dc-pd": 10.0, "colocated": 6.0}
    assert row.bcr_ratio["intra-dc-pd"] == pytest.approx(_ratio(9, 10, IDC_USD_H), rel=1e-5)
    assert row.bcr_ratio["colocated"] == pytest.approx(_ratio(9, 6, COLOCATED_USD_H), rel=1e-5)
    # 1.15 x the step costs: every family measured again
    row = rows["step costs x1.15"]
    assert row.bcr_ratio["intra-dc-pd"] == pytest.approx(_ratio(10.5, 8, IDC_USD_H), rel=1e-5)
    assert row.bcr_ratio["colocated"] == pytest.approx(_ratio(10.5, 5, COLOCATED_USD_H), rel=1e-5)
    # price rows reuse the confirmed means: the line at half price
    half = rows["line price x0.5"].bcr_ratio["intra-dc-pd"]
    line_usd_h = 20 * 72.4 / 730
    assert half == pytest.approx((13 / (PDD_USD_H - line_usd_h / 2)) / (10.5 / IDC_USD_H))


def test_plan_json_and_the_table_carry_the_rows() -> None:
    rtt = Remeasured(
        change=Change(kind="line_rtt", factor=2.0), text="line RTT x2", seed=0,
        capacity={"pdd": _capacity(9.0)}, reused=["intra-dc-pd", "colocated"],
    )  # fmt: skip
    plan = _plan([rtt])
    data = plan_json(plan)
    assert data["schema"] == "pdd-router/plan/4"
    assert data["sensitivity_seed"] == 0
    kinds = [(r["change"], r["kind"]) for r in data["sensitivity"]]
    assert kinds[-2:] == [("as confirmed, seed 0 alone", "measured"), ("line RTT x2", "measured")]
    assert data["remeasured"][0]["capacity"]["pdd"]["sla_goodput_req_s"] == 9.0
    table = sensitivity_table(plan)
    assert table is not None
    assert table.row_count == 7  # 5 price rows, the reference, the RTT
    assert sensitivity_table(_plan([])) is not None  # the price rows alone
    assert [r["kind"] for r in plan_json(_plan([]))["sensitivity"]] == ["price"] * 5
    # report.html shows the terminal's rows: the RTT row's ratio against intra-DC PD
    page = render_plan_report(plan, "pdd-router replay plan t")
    ratio = f"{_ratio(9, 10, IDC_USD_H):.2f}"
    assert ratio == "0.90"
    assert re.search(rf'<th class="metric">line RTT x2</th>\s*<td class="num">{ratio}</td>', page)
    assert "as confirmed, seed 0 alone" in page
    assert "Sensitivity of the verdict" in page


def _job(preset: str, replay: ReplaySettings) -> CapacityJob:
    return CapacityJob(
        trace="t.jsonl", preset=preset, policy="p", settings=CapacitySettings(),
        window=SteadyWindow(), replay=replay,
    )  # fmt: skip


def test_each_change_is_a_setting_of_the_same_capacity_job() -> None:
    pdd = _job("pdd-small", ReplaySettings(overrides={"links.wan.rtt_s": 0.02},
                                           kv_event_wan_delay_s=0.01))  # fmt: skip
    rtt = changed_job(Change(kind="line_rtt", factor=2.0), pdd)
    assert rtt is not None
    assert rtt.replay.overrides["links.wan.rtt_s"] == pytest.approx(0.04)
    assert rtt.replay.kv_event_wan_delay_s == pytest.approx(0.02)
    assert (
        changed_job(Change(kind="line_rtt", factor=2.0), _job("idc-pd-small", ReplaySettings()))
        is None
    )
    slow = changed_job(Change(kind="step_costs", factor=1.15), pdd)
    assert slow is not None
    assert slow.replay.step_cost_scale == 1.15
    assert slow.replay.overrides == pdd.replay.overrides
    assert Change(kind="step_costs", factor=0.85).text == "step costs x0.85"
    assert Change(kind="hit_skew").text == "hit rates flattened to 85-95%"
    flat = changed_job(Change(kind="hit_skew"), pdd)
    assert flat is not None
    assert flat.hit_band == (0.85, 0.95)
    assert flat.replay == pdd.replay


def test_the_rows_measured_again_are_on_by_default_and_no_sensitivity_skips_them(
    tmp_path: Path,
) -> None:
    from cli.plan_cmd import PlanOptions, _plan_of

    trace = tmp_path / "t.jsonl"
    trace.write_text("")
    on, _ = _plan_of(PlanOptions(trace=trace), ReplaySettings())
    off, _ = _plan_of(PlanOptions(trace=trace, no_sensitivity=True), ReplaySettings())
    assert on.sensitivity
    assert not off.sensitivity


def test_the_short_trace_warning_is_printed_once_with_its_count() -> None:
    from replay.experiments.capacity import SHORT_TRACE
    from replay.experiments.plan_output import printed_warnings

    warnings = [
        f"PDD a: {SHORT_TRACE} at 9.1 req/s: ...",
        "PDD a: seed 1: attainment is not monotone in the rate: ...",
        f"intra-DC PD b: {SHORT_TRACE} at 6.2 req/s: ...",
    ]
    printed = printed_warnings(warnings)
    assert len(printed) == 2
    assert printed[0].startswith(f"{SHORT_TRACE} in 2 of the plan's capacity searches")
    assert printed[1] == warnings[1]
    assert printed_warnings(warnings[1:2]) == warnings[1:2]

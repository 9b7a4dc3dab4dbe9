"""The demo's capacity rows and sentences, on capacities and costs computable by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.experiments import capacity_job as capacity_job_module
from replay.experiments.capacity import (
    CapacityProbe,
    CapacityResult,
    CapacitySettings,
    WindowedAttainment,
)
from replay.experiments.capacity_job import CapacityJob, run_capacity_job
from replay.experiments.demo_capacity import (
    bcr_at_capacity,
    capacity_cell,
    capacity_job,
    capacity_note,
    capacity_rows,
    capacity_verdict,
)
from replay.experiments.steady_replay import SteadyMeasure, SteadyWindow
from replay.runner.config import ReplaySettings
from replay.trace.synth import make_profile, write_synthetic_trace


def probe(rate: float, met: int, total: int = 100) -> CapacityProbe:
    windows = WindowedAttainment(met=(met,), total=(total,))
    return CapacityProbe(seed=0, rate_req_s=rate, attainment=met / total,
                         passed=met / total >= 0.9, windows=windows)  # fmt: skip


def result(cap: float, low: float, high: float, good: float, good_low: float,
           good_high: float, probes: list[CapacityProbe]) -> CapacityResult:  # fmt: skip
    return CapacityResult(
        capacity_req_s=cap, capacity_low_req_s=low, capacity_high_req_s=high,
        sla_goodput_req_s=good, sla_goodput_low_req_s=good_low, sla_goodput_high_req_s=good_high,
        per_seed_req_s=[cap], bracketed=True, monotone=True, probes=probes, warnings=[],
    )  # fmt: skip


# capacity 8 req/s, 90% of it met: 7.2 req/s of SLA goodput; at 120 USD/h, 60 per 1000 USD/h
SERVES = result(8.0, 7.5, 8.5, 7.2, 6.8, 7.6, [probe(5.0, 99), probe(8.0, 90), probe(10.0, 10)])
# failed at every probe down to 5 / 16 = 0.3125 req/s: no capacity
COLLAPSES = result(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, [probe(5.0, 0), probe(0.3125, 40)])


def test_bcr_at_capacity_is_sla_goodput_at_capacity_per_1000_usd_h() -> None:
    assert bcr_at_capacity(SERVES, 120.0) == pytest.approx(60.0)
    assert bcr_at_capacity(SERVES, 0.0) == 0.0


def test_capacity_rows_give_value_interval_and_bcr_per_deployment() -> None:
    rows = capacity_rows([SERVES, COLLAPSES], [120.0, 122.0])
    assert rows == [
        ("capacity (req/s) [95% interval]", ["8.00 [7.50, 8.50]", "< 0.31"]),
        ("SLA goodput at capacity (req/s) [95% interval]", ["7.20 [6.80, 7.60]", "< 0.31"]),
        ("BCR at capacity (req/s per 1000 USD/h)", ["60.0", "0.0"]),
    ]


def test_capacity_cell_names_the_lowest_probe_when_none_passed() -> None:
    assert capacity_cell(1.2345, 1.1, 1.3, 0.5) == "1.23 [1.10, 1.30]"
    assert capacity_cell(0.0, 0.0, 0.0, 0.15625) == "< 0.16"


def test_verdict_compares_pdd_with_each_other_deployment() -> None:
    labels = ["intra-DC PD", "naive cross-DC PD", "PDD"]
    # 66 / 60 = 1.10: +10.0%; 66 / 5 = 13.2 times
    assert capacity_verdict(labels, [60.0, 5.0, 66.0]) == (
        "PDD: BCR at capacity 66.0, +10.0% against intra-DC PD's; 13.2x naive cross-DC PD's."
    )
    assert capacity_verdict(labels, [80.0, 0.0, 60.0]) == (
        "PDD: BCR at capacity 60.0, -25.0% against intra-DC PD's; "
        "naive cross-DC PD serves nothing within the SLA."
    )


def test_capacity_job_starts_at_the_trace_rate_and_stops_at_a_sixteenth() -> None:
    settings = ReplaySettings(seed=3, max_requests=40)
    job = capacity_job(Path("t.jsonl"), "xdc-pd-small", "xdc-pd", start_req_s=5.0,
                       settings=settings)  # fmt: skip
    assert job.settings.seeds == (3, 4)
    assert job.settings.start_req_s == 5.0
    assert job.settings.floor_req_s == pytest.approx(0.3125)
    assert job.settings.tolerance == 0.02
    assert job.settings.target == 0.9
    assert job.window == SteadyWindow()  # replay sweep's window
    assert (job.trace, job.preset, job.policy, job.replay) == (
        "t.jsonl",
        "xdc-pd-small",
        "xdc-pd",
        settings,
    )


def test_capacity_note_states_the_window_seeds_and_budget() -> None:
    settings = CapacitySettings(seeds=(0, 1), max_probes=14)
    note = capacity_note(settings, SteadyWindow(warmup_s=60, window_s=300, windows=5))
    assert "90% of requests" in note
    assert "60 s of warm-up left out, 300 s judged in 5 windows" in note
    assert "bisected to 2%" in note
    assert "at most 14 probes per seed (seeds 0, 1)" in note
    assert "1/16 of the trace's rate" in note


def test_capacity_job_measures_only_the_first_max_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "t.jsonl"
    write_synthetic_trace(trace, make_profile("agentic", {"rate": 5.0}), 30, 0)
    seen: list[int] = []

    def fake_find(measure: SteadyMeasure, settings: CapacitySettings) -> CapacityResult:
        seen.append(len(measure.requests))
        return SERVES

    monkeypatch.setattr(capacity_job_module, "find_capacity", fake_find)
    rules = CapacitySettings()
    for limit in (12, None):
        replay = ReplaySettings(max_requests=limit)
        job = CapacityJob(trace=str(trace), preset="pdd-small", policy="pdd", settings=rules,
                          window=SteadyWindow(), replay=replay)  # fmt: skip
        assert run_capacity_job(job) == SERVES
    assert seen == [12, 30]

"""Offline A/B: policy words, paired comparisons that reproduce summary.json, the bathtub."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from replay_support import replay

from replay.experiments.compare import CompareConfig, auto_window, compare_results, run_compare
from replay.experiments.compare_stats import metric_specs, point_values, policy_data, window_of
from replay.experiments.policy_spec import parse_policy_spec, parse_policy_specs
from replay.metrics.hit_buckets import BUCKET_LABELS, bucket_index, request_hit_rates
from replay.runner.run import ReplayResult
from replay.trace.mooncake import write_mooncake
from replay.trace.record import TraceRequest
from replay.trace.synth import make_profile, synthesize
from router.errors import UserError


@pytest.fixture(scope="module")
def requests() -> list[TraceRequest]:
    return list(synthesize(make_profile("agentic"), 400, seed=3))


@pytest.fixture(scope="module")
def runs(requests: list[TraceRequest]) -> dict[str, ReplayResult]:
    return {name: replay(requests, "pdd-small", name, seed=0) for name in ("xdc-pd", "pdd")}


def test_policy_words_parse_to_names_and_typed_parameters() -> None:
    spec = parse_policy_spec(" pdd:wan_budget_s=0.5, chunk_tokens=32 ")
    assert (spec.label, spec.name) == ("pdd:wan_budget_s=0.5, chunk_tokens=32", "pdd")
    assert spec.params == {"wan_budget_s": 0.5, "chunk_tokens": 32}
    assert parse_policy_spec("xdc-pd").params == {}


@pytest.mark.parametrize(
    ("word", "needle"),
    [
        ("nope", "valid policies: colocated, idc-pd,"),
        ("pdd:wan_budget=1", "parameters of pdd: "),
        ("pdd:wan_budget_s", "is not KEY=VALUE"),
        ("pdd:wan_budget_s=-1", "greater than 0"),
        (":x=1", "no policy name"),
    ],
)
def test_bad_policy_words_are_one_line_errors(word: str, needle: str) -> None:
    with pytest.raises(UserError) as info:
        parse_policy_spec(word)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_a_comparison_needs_two_distinct_policies() -> None:
    with pytest.raises(UserError, match="at least 2"):
        parse_policy_specs(["pdd"], minimum=2)
    with pytest.raises(UserError, match="given twice"):
        parse_policy_specs(["pdd", "pdd"], minimum=2)


def test_every_bootstrapped_metric_reproduces_summary_json(runs: dict[str, ReplayResult]) -> None:
    summaries = [r.summary for r in runs.values()]
    checked = 0
    for result in runs.values():
        records = sorted(result.records, key=lambda r: r.request_id)
        arrival = np.array([r.arrival_s for r in records])
        data = policy_data(result.summary, records, window_of(arrival, 5.0))
        for spec in metric_specs(summaries):
            if spec.stat is None:
                continue
            expected, got = spec.value(result.summary), point_values(spec, data)
            if expected is None:
                assert got is None, spec.key
            else:
                assert got == pytest.approx(expected, rel=1e-6, abs=1e-6), spec.key
                checked += 1
    assert checked > 60


def test_pdd_beats_naive_cross_dc_significantly_on_ttft(runs: dict[str, ReplayResult]) -> None:
    names = ["xdc-pd", "pdd"]
    result = compare_results(
        parse_policy_specs(names), [runs[n] for n in names], resamples=300, seed=1
    )
    rows = {row.spec.key: row for row in result.rows}
    ttft = rows["ttft_s.p99"].differences[0]
    assert ttft.difference is not None
    assert ttft.difference < 0
    assert ttft.ci is not None
    assert ttft.ci.high < 0
    assert ttft.significant
    wan = rows["wan_bytes"].differences[0]
    assert wan.significant
    assert wan.difference is not None
    assert wan.difference < 0
    assert rows["wan_gbps_peak"].differences[0].ci is None  # a maximum gets no interval
    assert rows["ttft_s.p99"].values == [r.summary.ttft_s.p99 for r in runs.values()]


def test_a_policy_against_itself_differs_by_nothing(requests: list[TraceRequest]) -> None:
    specs = parse_policy_specs(["pdd", "pdd:wan_budget_s=1.0"])  # the default budget
    results = [replay(requests, "pdd-small", s.name, seed=0, policy_params=s.params) for s in specs]
    result = compare_results(specs, results, resamples=200, seed=0)
    for row in result.rows:
        d = row.differences[0]
        assert d.difference in (0.0, None), row.spec.key
        assert not d.significant, row.spec.key


def test_compare_json_and_the_bathtub(tmp_path: Path, requests: list[TraceRequest]) -> None:
    trace = tmp_path / "trace.jsonl"
    with trace.open("w", encoding="utf-8") as out:
        write_mooncake(requests, out)
    result = run_compare(
        CompareConfig(
            trace=str(trace), preset="pdd-small", policies=["xdc-pd", "pdd"], resamples=200
        )
    )
    result.write_json(tmp_path / "compare.json")
    data = json.loads((tmp_path / "compare.json").read_text())
    assert data["schema"] == "pdd-router/compare/2"
    assert data["baseline"] == "xdc-pd"
    assert [p["label"] for p in data["policies"]] == ["xdc-pd", "pdd"]
    assert data["bootstrap"]["windows"] >= 30
    keys = {m["key"] for m in data["metrics"]}
    assert {
        "ttft_s.p99", "sla_goodput_req_s", "wan_gbps_mean", "bcr_at_trace_rate_per_1000_usd_h",
        "sla_attainment",
    } <= keys  # fmt: skip
    goodput = next(m for m in data["metrics"] if m["key"] == "sla_goodput_req_s")
    assert goodput["method"] == "windows"
    assert set(goodput["differences"]["pdd"]) == {"difference", "relative", "ci", "significant"}
    tub = data["bathtub"]
    assert tub["buckets"] == list(BUCKET_LABELS)
    assert sum(tub["counts"]) == len(requests)
    rates = request_hit_rates(requests)
    expected = np.bincount(bucket_index(np.array(list(rates.values()))), minlength=7)
    assert tub["counts"] == expected.tolist()


def test_the_rate_window_gives_at_least_30_windows() -> None:
    assert auto_window(3600.0, None) == 60.0
    assert auto_window(300.0, None) == pytest.approx(10.0)
    assert auto_window(300.0, 25.0) == 25.0

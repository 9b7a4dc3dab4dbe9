"""run_replay: refusals before the run, determinism, and the speed figure on a real trace."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from replay_support import replay

from replay.metrics import write_run
from replay.presets import load_preset, preset_names
from replay.runner.run import ReplayResult
from replay.trace.record import TraceRequest
from replay.trace.synth import make_profile, synthesize
from router.errors import UserError

WEATHER = {"links.wan.fluctuation": {"period_s": 5.0, "low": 0.3, "high": 1.0}}


@pytest.fixture(scope="module")
def agentic() -> list[TraceRequest]:
    return list(synthesize(make_profile("agentic"), 400, seed=3))


def test_presets_mirror_the_papers_deployments() -> None:
    assert {"idc-pd", "xdc-pd", "pdd", "idc-pd-small", "xdc-pd-small", "pdd-small"} <= set(
        preset_names()
    )
    assert load_preset("idc-pd").gpu_counts() == {"h100": 88}
    assert load_preset("xdc-pd").gpu_counts() == {"h100": 88}
    assert load_preset("pdd").gpu_counts() == {"h100": 43, "h200": 32}
    idc, pdd = load_preset("idc-pd"), load_preset("pdd")
    assert pdd.cost_per_hour() < idc.cost_per_hour()
    assert idc.datacenters() == ["A"]
    assert pdd.datacenters() == ["A", "B"]


def test_unknown_preset_and_policy_list_the_valid_names(agentic: list[TraceRequest]) -> None:
    with pytest.raises(UserError, match=r"unknown preset 'nope'; valid presets: .*pdd-small"):
        replay(agentic, "nope")
    with pytest.raises(UserError, match=r"unknown policy 'nope'.*idc-pd.*pdd.*xdc-pd"):
        replay(agentic, "pdd-small", "nope")


@pytest.mark.parametrize(
    ("preset", "policy", "overrides", "message"),
    [
        ("pdd-small", None, {"pools.md.instances": 0}, r"policy pdd-adaptive needs a md pool"),
        ("idc-pd-small", "pdd", {}, r"policy pdd needs a rld pool"),
        ("pdd-small", None, {"links.wan.bandwidth_gbps": 0}, r"WAN bandwidth must be positive"),
        ("pdd-small", None, {"links.wan": None}, r"no WAN link"),
        ("pdd-small", None, {"pools.rld.kv_capacity_tokens": 4096}, r"pool rld holds 4096 KV"),
        ("pdd-small", None, {"pools.md.gpus_per_instance": 1}, r"pool md holds 0 KV tokens"),
        ("pdd-small", None, {"pools.md.hardware": "tpu"}, r"hardware: a100-40gb, .*, h200"),
        ("pdd-small", None, {"pools.md.instances": -1}, r"pools.md.instances"),
    ],
)
def test_impossible_clusters_are_refused_before_the_run(
    agentic: list[TraceRequest],
    preset: str,
    policy: str | None,
    overrides: dict[str, Any],
    message: str,
) -> None:
    with pytest.raises(UserError, match=message):
        replay(agentic, preset, policy, overrides=overrides)


def _bytes(result: ReplayResult, tmp: Path) -> tuple[dict[str, Any], str]:
    write_run(tmp, result.summary, result.records)
    summary = json.loads((tmp / "summary.json").read_text())
    summary.pop("wall_s")
    return summary, (tmp / "requests.jsonl").read_text()


def test_same_seed_same_bytes_and_the_seed_matters(
    agentic: list[TraceRequest], tmp_path: Path
) -> None:
    runs = [
        _bytes(replay(agentic, "pdd-small", seed=seed, overrides=WEATHER), tmp_path / str(i))
        for i, seed in enumerate((5, 5, 6))
    ]
    assert runs[0] == runs[1]
    assert runs[0][1] != runs[2][1]  # another seed, another weather on the WAN


def test_summary_is_consistent_with_the_records(agentic: list[TraceRequest]) -> None:
    result = replay(agentic, "pdd-small", rate_scale=2.0)
    s, records = result.summary, result.records
    assert s.requests == len(records) == 400
    # twice the trace's rate is past pdd-small's capacity: the default policy refuses some
    refused = [r for r in records if r.rejected is not None]
    assert 0 < s.rejected == len(refused) < 400
    assert sum(s.rejected_by.values()) == s.rejected
    assert all(r.pipeline == "rejected" and r.ttft_s is None for r in refused)
    assert s.completed == 400 - s.rejected
    assert sum(s.pipelines.values()) == s.completed
    assert s.wan_bytes == pytest.approx(sum(r.wan_bytes for r in records))
    assert 0 < s.wan_gbps_mean <= s.wan_gbps_peak <= 20.0 + 1e-6
    assert s.ttft_s.p50 is not None
    assert s.ttft_s.p99 is not None
    assert s.ttft_s.p50 <= s.ttft_s.p99
    assert s.bcr_at_trace_rate_per_1000_usd_h == pytest.approx(
        s.sla_goodput_req_s / s.cost_per_hour * 1000, rel=1e-6
    )
    assert s.sla_goodput_req_s <= s.throughput_rps
    tokens = sum(r.output_length for r in records if r.rejected is None)
    assert sum(r.tokens_rld + r.tokens_md for r in records) == tokens
    assert s.rld_token_share == pytest.approx(sum(r.tokens_rld for r in records) / tokens, abs=1e-6)
    slower = replay(agentic, "pdd-small", rate_scale=1.0).summary
    assert slower.trace_duration_s == pytest.approx(2 * s.trace_duration_s)


@pytest.mark.slow
def test_speed_on_the_conversation_trace(conversation_trace: Path) -> None:
    """Prints the figure; the target is <= 10 s wall on one core (>= 350x real time)."""
    started = time.perf_counter()
    summary = replay(conversation_trace, "pdd").summary
    wall = time.perf_counter() - started
    print(
        f"\nconversation trace on pdd: {summary.requests} requests, "
        f"{summary.simulated_s:.0f} s simulated in {wall:.2f} s wall "
        f"({summary.simulated_s / wall:.0f}x real time)"
    )
    assert summary.completed + summary.rejected == summary.requests  # nothing lost
    assert summary.completed > 0.95 * summary.requests


def test_a_first_token_from_the_decode_side_arrives_one_step_later(
    agentic: list[TraceRequest],
) -> None:
    """With ``timing.first_token_on_decode`` (what a client sees through the router, and what
    calibrated presets set), a request's first token is its decode instance's first step,
    not the prefill's token forwarded on joining: TTFT grows by about one decode step."""
    forwarded = replay(agentic, "idc-pd-small")
    stepped = replay(agentic, "idc-pd-small", overrides={"timing.first_token_on_decode": True})
    by_id = {r.request_id: r for r in forwarded.records}
    added = []
    for r in stepped.records:
        before = by_id[r.request_id]
        assert r.ttft_s is not None
        assert before.ttft_s is not None
        assert before.tpot_s is not None
        added.append((r.ttft_s - before.ttft_s) / before.tpot_s)
    added.sort()
    assert 0.5 < added[len(added) // 2] < 2.0  # the median request: about one step more
    assert stepped.summary.requests == forwarded.summary.requests
    assert stepped.summary.completed == forwarded.summary.completed


def test_summary_shows_the_load_of_each_tier_and_the_line_and_the_cost_split(
    agentic: list[TraceRequest], tmp_path: Path
) -> None:
    result = replay(agentic, "pdd-small", rate_scale=2.0)
    s = result.summary
    assert sum(s.cost_split.values()) == pytest.approx(s.cost_per_hour, rel=1e-6)
    assert set(s.cost_split) == {"p", "rld", "md", "wan"}
    assert s.cost_split["wan"] == pytest.approx(20 * 72.4 / 730, rel=1e-6)  # 20 Gbps line
    assert s.wan_utilization == pytest.approx(s.wan_gbps_mean / 20.0, rel=1e-4)
    timeline = s.timeline
    assert timeline is not None
    assert 10 <= len(timeline.t_s) <= 120
    assert timeline.t_s[0] == 0.0
    assert all(b > a for a, b in zip(timeline.t_s, timeline.t_s[1:], strict=False))
    assert timeline.window_s * (len(timeline.t_s) - 1) <= s.simulated_s + timeline.window_s
    assert s.wan_backlog_gb_peak == pytest.approx(max(timeline.wan_backlog_gb))
    assert s.wan_backlog_gb_peak > 0  # twice the rate backs the line up
    assert max(timeline.wan_gbps) <= 20.0 + 1e-6
    for tier in ("p", "rld", "md"):
        series = timeline.utilization[tier]
        assert len(series) == len(timeline.t_s)
        assert all(0.0 <= u <= 1.0 for u in series)
        assert 0.0 <= s.kv_used[tier] <= 1.0
    assert s.utilization["p"] > 0.3  # P is the bottleneck of this trace at twice its rate
    write_run(tmp_path, s, result.records)
    rows = (tmp_path / "timeline.csv").read_text().splitlines()
    assert rows[0].startswith("t_s,wan_gbps,wan_backlog_gb,wan_busy,utilization_p")
    assert len(rows) == len(timeline.t_s) + 1
    # one datacenter: no line to pay for or to fill
    idc = replay(agentic, "idc-pd-small").summary
    assert "wan" not in idc.cost_split
    assert idc.wan_utilization == 0.0
    assert idc.timeline is not None
    assert idc.timeline.wan_gbps == []

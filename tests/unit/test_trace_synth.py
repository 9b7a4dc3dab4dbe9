"""Synthetic agentic traces: the skewed hit-rate properties, odd traffic, determinism."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.trace.formats import read_trace
from replay.trace.record import TraceRequest
from replay.trace.stats import TraceStats, compute_stats
from replay.trace.synth import make_profile, synthesize, write_synthetic_trace
from replay.trace.synth_agentic import AgenticProfile
from router.errors import UserError


@pytest.fixture(scope="module")
def agentic_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("synth") / "agentic.jsonl"
    write_synthetic_trace(path, make_profile("agentic"), 5000, seed=0)
    return path


@pytest.fixture(scope="module")
def agentic_requests(agentic_trace: Path) -> list[TraceRequest]:
    return list(read_trace(agentic_trace))


@pytest.fixture(scope="module")
def agentic_stats(agentic_requests: list[TraceRequest]) -> TraceStats:
    return compute_stats(agentic_requests)


def test_mean_hit_rate_is_about_ninety_percent(agentic_stats: TraceStats) -> None:
    assert agentic_stats.hit_rate_mean is not None
    assert 0.85 <= agentic_stats.hit_rate_mean <= 0.95


def test_most_requests_hit_above_95_percent(agentic_stats: TraceStats) -> None:
    assert agentic_stats.hit_share_above_95 is not None
    assert 0.70 <= agentic_stats.hit_share_above_95 <= 0.80
    buckets = agentic_stats.hit_buckets
    assert buckets is not None
    above = sum(share for label, share in buckets.items() if label not in ("0-90%", "90-95%"))
    assert above == pytest.approx(agentic_stats.hit_share_above_95)


def test_a_minority_of_low_hit_requests(agentic_stats: TraceStats) -> None:
    coarse = agentic_stats.hit_buckets_coarse
    assert coarse is not None
    assert 0.05 <= coarse["0-50%"] <= 0.15


def test_three_to_four_percent_odd_traffic(agentic_stats: TraceStats) -> None:
    assert 0.03 <= agentic_stats.odd_share <= 0.04


def test_arrival_rate_near_the_profile_rate(agentic_stats: TraceStats) -> None:
    assert agentic_stats.arrival_rate_rps is not None
    assert 8.0 <= agentic_stats.arrival_rate_rps <= 12.5
    assert agentic_stats.requests == 5000


def test_shape_of_the_requests(agentic_requests: list[TraceRequest]) -> None:
    arrivals = [r.arrival_s for r in agentic_requests]
    assert arrivals == sorted(arrivals)
    assert all(r.hash_ids[0] == 0 for r in agentic_requests)  # shared system prompt
    assert all(
        (len(r.hash_ids) - 1) * 512 < r.input_length <= len(r.hash_ids) * 512
        for r in agentic_requests
    )
    assert all(r.session_id is not None and r.turn is not None for r in agentic_requests)
    assert max(r.hash_ids[0] for r in agentic_requests) == 0
    # IDs are numbered by first appearance, as in the Mooncake release
    seen: set[int] = set()
    next_id = 0
    for request in agentic_requests[:200]:
        for block in request.hash_ids:
            if block not in seen:
                assert block == next_id
                seen.add(block)
                next_id += 1


def test_same_seed_same_bytes(tmp_path: Path, agentic_trace: Path) -> None:
    again = tmp_path / "again.jsonl"
    write_synthetic_trace(again, make_profile("agentic"), 5000, seed=0)
    assert again.read_bytes() == agentic_trace.read_bytes()
    other = tmp_path / "other.jsonl"
    write_synthetic_trace(other, make_profile("agentic"), 5000, seed=1)
    assert other.read_bytes() != agentic_trace.read_bytes()


def test_rate_parameter_scales_arrivals() -> None:
    fast = compute_stats(synthesize(make_profile("agentic", {"rate": 40.0}), 4000, seed=3))
    assert fast.arrival_rate_rps is not None
    assert 30.0 <= fast.arrival_rate_rps <= 50.0


def test_every_parameter_is_documented() -> None:
    for name, info in AgenticProfile.model_fields.items():
        assert info.description, name


def test_bad_profile_and_parameters() -> None:
    with pytest.raises(UserError, match="supported: agentic"):
        make_profile("chatty")
    with pytest.raises(UserError, match="rate"):
        make_profile("agentic", {"rate": -1.0})
    with pytest.raises(UserError, match="odd_input_min"):
        make_profile("agentic", {"odd_input_min": 10, "odd_input_max": 5})
    with pytest.raises(UserError, match="positive"):
        synthesize(make_profile("agentic"), 0)


def test_a_mistyped_parameter_is_named_with_the_valid_ones() -> None:
    with pytest.raises(UserError) as info:
        make_profile("agentic", {"output_medain": 300})
    message = str(info.value)
    assert message.startswith("bad profile parameter: output_medain: unknown parameter; ")
    assert "parameters of profile agentic: block_size, " in message
    assert "output_median" in message


def test_unwritable_output(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot write"):
        write_synthetic_trace(tmp_path / "missing" / "x.jsonl", make_profile("agentic"), 10)

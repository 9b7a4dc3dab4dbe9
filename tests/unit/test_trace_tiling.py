"""Tiling a trace: more of the same traffic, at the same rate, with no invented prefix reuse."""

from __future__ import annotations

import pytest

from replay.trace.caches import UnboundedPrefixCache
from replay.trace.record import TraceRequest
from replay.trace.stats import hit_tokens
from replay.trace.synth_agentic import AgenticProfile, synthesize_agentic
from replay.trace.tiling import copies_for, rotate, seed_phase, tile, tile_period_s
from router.errors import UserError


def agentic(n: int = 300) -> list[TraceRequest]:
    return list(synthesize_agentic(AgenticProfile(rate=5.0), n, seed=3))


def test_copies_follow_each_other_at_the_traces_own_rate() -> None:
    trace = [TraceRequest(i, float(i), 10, 2, (i,), 16) for i in range(50)]  # 1 req/s
    tiled = tile(trace, 4)
    arrivals = [r.arrival_s for r in tiled]
    assert len(tiled) == 200
    assert arrivals == [float(i) for i in range(200)]  # evenly spaced still: rate 1 req/s
    assert tile_period_s(trace) == 50.0
    assert copies_for(trace, 120.0) == 3
    assert copies_for(trace, 150.0) == 3
    assert copies_for(trace, 151.0) == 4


def test_each_copy_reuses_its_own_prefixes_and_none_of_another_copys() -> None:
    trace = agentic()
    one = hit_tokens(UnboundedPrefixCache(), trace).sum()
    tiled = tile(trace, 3)
    three = hit_tokens(UnboundedPrefixCache(), tiled).sum()
    assert one > 0
    assert three == 3 * one  # reuse within each copy kept, none across copies
    blocks = [{h for r in tiled[k * 300 : (k + 1) * 300] for h in r.hash_ids} for k in range(3)]
    assert not (blocks[0] & blocks[1])
    assert not (blocks[1] & blocks[2])


def test_copies_get_fresh_request_and_session_ids() -> None:
    trace = agentic()
    tiled = tile(trace, 2)
    assert len({r.request_id for r in tiled}) == len(tiled)
    sessions = [{r.session_id for r in tiled[k * 300 : (k + 1) * 300]} for k in range(2)]
    assert sessions[0]
    assert not (sessions[0] & sessions[1])
    assert [r.input_length for r in tiled[300:]] == [r.input_length for r in tiled[:300]]


def test_a_trace_that_arrives_at_once_cannot_be_tiled() -> None:
    trace = [TraceRequest(i, 5.0, 10, 2, (), 16) for i in range(3)]
    with pytest.raises(UserError, match="all arrive at once"):
        tile(trace, 2)


def test_a_rotation_moves_the_sessions_that_begin_before_the_phase_one_period_later() -> None:
    # sessions a (0, 1, 5), b (2, 3), c (4) and an unsessioned request at 6: span 6,
    # 7 requests, period 6 + 6 / 6 = 7; phase 0.4 cuts at 2.8: a and b (begun at 0 and 2)
    # move 7 s later, whole; c (begun at 4) and the lone request stay
    trace = [
        TraceRequest(0, 0.0, 10, 2, (), 16, session_id="a"),
        TraceRequest(1, 1.0, 10, 2, (), 16, session_id="a", parent_id="a"),
        TraceRequest(2, 2.0, 10, 2, (), 16, session_id="b"),
        TraceRequest(3, 3.0, 10, 2, (), 16, session_id="b", parent_id="b"),
        TraceRequest(4, 4.0, 10, 2, (), 16, session_id="c"),
        TraceRequest(5, 5.0, 10, 2, (), 16, session_id="a", parent_id="a"),
        TraceRequest(6, 6.0, 10, 2, (), 16),
    ]
    rotated = rotate(trace, 0.4)
    assert [r.request_id for r in rotated] == [4, 6, 0, 1, 2, 3, 5]
    assert [r.arrival_s for r in rotated] == pytest.approx([4.0, 6.0, 7.0, 8.0, 9.0, 10.0, 12.0])
    assert [r.parent_id for r in rotated] == [None, None, None, "a", None, "b", "a"]
    assert rotate(trace, 0.0) == trace  # seed 0's phase: the trace as it is


def test_seed_zero_keeps_the_trace_and_other_seeds_start_elsewhere() -> None:
    assert seed_phase(0) == 0.0
    assert seed_phase(1) == pytest.approx(0.6180339887)
    assert seed_phase(2) == pytest.approx(0.2360679775)
    with pytest.raises(UserError, match="phase"):
        rotate(agentic(10), 1.0)


def test_tiling_a_rotated_trace_at_the_traces_period_keeps_its_rate() -> None:
    trace = [TraceRequest(i, float(i), 10, 2, (i,), 16) for i in range(50)]  # period 50
    tiled = tile(rotate(trace, 0.5), 2, period_s=tile_period_s(trace))
    assert [r.arrival_s for r in tiled] == [float(i) for i in range(25, 125)]

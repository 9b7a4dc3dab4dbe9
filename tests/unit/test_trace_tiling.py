"""Tiling a trace: more of the same traffic, at the same rate, with no invented prefix reuse."""

from __future__ import annotations

import pytest

from replay.trace.caches import UnboundedPrefixCache
from replay.trace.record import TraceRequest
from replay.trace.stats import hit_tokens
from replay.trace.synth_agentic import AgenticProfile, synthesize_agentic
from replay.trace.tiling import copies_for, tile, tile_period_s
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

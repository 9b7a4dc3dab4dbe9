"""Flattening a trace's hit-rate skew: the same requests, each hitting a prefix in a band."""

from __future__ import annotations

import numpy as np
import pytest

from replay.trace.caches import UnboundedPrefixCache
from replay.trace.checks import TraceChecks
from replay.trace.flatten_hits import flatten_hits
from replay.trace.record import TraceRequest
from replay.trace.stats import hit_tokens
from replay.trace.synth import make_profile, synthesize

BS = 10


def _req(rid: int, at: float, ids: range | list[int], session: str) -> TraceRequest:
    ids = list(ids)
    return TraceRequest(rid, at, len(ids) * BS, 7 + rid, tuple(ids), BS, session_id=session)


def _rates(requests: list[TraceRequest]) -> list[float]:
    hits = hit_tokens(UnboundedPrefixCache(), requests)
    return [h / r.input_length for h, r in zip(hits.tolist(), requests, strict=True)]


def test_a_hand_made_trace_hits_90_percent_where_its_earlier_requests_allow() -> None:
    trace = [
        _req(0, 0.0, range(10), "a"),  # nothing earlier: hits nothing
        _req(1, 1.0, range(20), "a"),  # wants 18 blocks; the longest earlier has 10
        _req(2, 2.0, range(100, 110), "b"),  # a fresh session: 9 blocks of the latest
        _req(3, 3.0, range(20), "a"),  # all 20 cached before; 18 of its session's
    ]
    out = flatten_hits(trace, low=0.9, high=0.9)
    assert _rates(trace) == [0.0, 0.5, 0.0, 1.0]
    assert _rates(out) == [0.0, 0.5, 0.9, 0.9]
    # new IDs start above the trace's (109); each request continues its donor's chain
    assert out[0].hash_ids == tuple(range(110, 120))
    assert out[1].hash_ids == tuple(range(110, 130))
    assert out[2].hash_ids == (*range(110, 119), 130)
    assert out[3].hash_ids == (*range(110, 128), 131, 132)
    for before, after in zip(trace, out, strict=True):
        assert (after.request_id, after.arrival_s, after.input_length, after.output_length) == (
            before.request_id, before.arrival_s, before.input_length, before.output_length
        )  # fmt: skip
        assert after.session_id == before.session_id
        assert len(after.hash_ids) == len(before.hash_ids)


def test_a_skewed_trace_is_flattened_into_the_band_up_to_half_a_block() -> None:
    trace = list(synthesize(make_profile("agentic"), 400, seed=2))
    before = np.array(_rates(trace))
    assert np.mean(before > 0.95) > 0.5  # skewed: most hit nearly everything
    assert np.mean(before < 0.5) > 0.05  # and some hit little
    out = flatten_hits(trace, low=0.85, high=0.95, seed=4)
    after = np.array(_rates(out))
    slack = np.array([0.5 * r.block_size / r.input_length for r in out])
    inside = (after >= 0.85 - slack - 1e-12) & (after <= 0.95 + slack + 1e-12)
    assert inside.mean() > 0.98
    # the others hit all they could: every full block of the longest earlier request
    hits = hit_tokens(UnboundedPrefixCache(), out)
    for i in np.flatnonzero(~inside):
        longest = max((r.input_length // r.block_size for r in out[:i]), default=0)
        assert after[i] < 0.85
        assert hits[i] == longest * out[i].block_size
    assert [r.request_id for r in out] == sorted(r.request_id for r in trace)
    assert flatten_hits(trace, low=0.85, high=0.95, seed=4) == out  # a pure function


def test_a_band_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"band \[0.9, 0.8\]"):
        flatten_hits([], low=0.9, high=0.8)


def test_a_partial_last_block_is_never_handed_on_as_a_full_one() -> None:
    """A prompt of 25 tokens in blocks of 10 ends in a partial block; a later prompt that
    reuses the chain takes its two full blocks only (else the trace contradicts itself,
    and aiperf refuses it)."""
    first = TraceRequest(0, 0.0, 25, 5, (0, 1, 2), BS, session_id="a")
    later = TraceRequest(1, 1.0, 40, 5, (10, 11, 12, 13), BS, session_id="a")
    out = flatten_hits([first, later], low=0.9, high=0.9)
    assert out[1].hash_ids[:2] == out[0].hash_ids[:2]
    assert out[1].hash_ids[2] != out[0].hash_ids[2]  # the partial block stays the first's
    checks = TraceChecks("flattened")
    for line, request in enumerate(out, start=1):
        checks.observe(line, request)
    assert checks.report() == []
    trace = list(synthesize(make_profile("agentic"), 300, seed=3))
    checks = TraceChecks("agentic")
    for line, request in enumerate(flatten_hits(trace), start=1):
        checks.observe(line, request)
    assert checks.report() == []

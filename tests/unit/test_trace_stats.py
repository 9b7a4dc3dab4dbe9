"""Trace statistics: hit rates with unbounded and LRU caches, buckets, odd traffic."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.trace.caches import LruPrefixCache, UnboundedPrefixCache
from replay.trace.formats import read_trace
from replay.trace.record import TraceRequest
from replay.trace.stats import HIT_BUCKETS, compute_stats
from router.errors import UserError


def _req(i: int, t: float, inp: int, ids: tuple[int, ...], out: int = 10) -> TraceRequest:
    return TraceRequest(i, t, inp, out, ids, 4)


def test_unbounded_cache_counts_leading_blocks_only() -> None:
    cache = UnboundedPrefixCache()
    assert cache.visit([1, 2, 3]) == 0
    assert cache.visit([1, 2, 9]) == 2
    assert cache.visit([7, 2, 3]) == 0  # a miss at the front stops the count
    assert len(cache) == 5


def test_lru_cache_evicts_least_recent_first() -> None:
    cache = LruPrefixCache(3)
    assert cache.visit([1, 2, 3]) == 0
    assert cache.visit([1, 4]) == 1  # touches 1, inserts 4, evicts 2
    assert cache.visit([1, 2]) == 1
    assert cache.visit([3]) == 0  # 3 was evicted by 2
    assert LruPrefixCache(0).visit([1]) == 0


def test_hit_rates_buckets_and_sizes() -> None:
    requests = [
        _req(0, 0.0, 10, (1, 2, 3)),  # 0 hit
        _req(1, 1.0, 12, (1, 2, 3)),  # 3 blocks = 12 tokens: 100%
        _req(2, 2.0, 10, (1, 2, 5)),  # 2 blocks = 8 tokens: 80%
        _req(3, 4.0, 0, ()),  # empty prompt: left out of per-request figures
    ]
    stats = compute_stats(requests, cache_tokens=[4, 8])
    assert stats.requests == 4
    assert stats.duration_s == 4.0
    assert stats.arrival_rate_rps == 1.0
    assert stats.hit_rate_tokens == pytest.approx(20 / 32)
    assert stats.hit_rate_mean == pytest.approx((0 + 1 + 0.8) / 3)
    assert stats.hit_buckets is not None
    assert list(stats.hit_buckets) == [label for label, _ in HIT_BUCKETS]
    assert stats.hit_buckets["0-90%"] == pytest.approx(2 / 3)
    assert stats.hit_buckets["99-100%"] == pytest.approx(1 / 3)
    assert stats.hit_buckets_coarse == pytest.approx(
        {"0-50%": 1 / 3, "50-90%": 1 / 3, "90-100%": 1 / 3}
    )
    assert stats.hit_share_above_95 == pytest.approx(1 / 3)
    # 1 or 2 blocks: a request's first blocks are the least recent, so they go first
    assert stats.lru_hit_rate_tokens == {4: 0.0, 8: 0.0}
    assert stats.input_length.max == 12
    assert stats.prefix_info


def test_bucket_bounds_include_the_lower_edge() -> None:
    chain = tuple(range(1, 20))
    first = _req(0, 0.0, 80, (*chain, 99))
    exactly_95 = _req(1, 1.0, 80, (*chain, 100))  # 19 blocks of 4 = 76 of 80 tokens
    stats = compute_stats([first, exactly_95])
    assert stats.hit_buckets is not None
    assert stats.hit_buckets["95-96%"] == pytest.approx(0.5)
    assert stats.hit_share_above_95 == pytest.approx(0.5)


def test_requests_are_taken_in_arrival_order() -> None:
    late = _req(0, 5.0, 8, (1, 2))
    early = _req(1, 1.0, 8, (1, 2))
    stats = compute_stats([late, early])
    assert stats.hit_rate_tokens == pytest.approx(0.5)  # the early one misses, the late hits
    assert stats.duration_s == 4.0


def test_odd_traffic_thresholds_are_inclusive() -> None:
    requests = [
        _req(0, 0.0, 100, (), out=5),
        _req(1, 0.0, 99, (), out=5),
        _req(2, 0.0, 100, (), out=6),
    ]
    stats = compute_stats(requests, odd_min_input=100, odd_max_output=5)
    assert stats.odd_requests == 1
    assert stats.odd_share == pytest.approx(1 / 3)


def test_no_prefix_information_gives_no_hit_rates() -> None:
    stats = compute_stats([_req(0, 0.0, 10, ())], cache_tokens=[100])
    assert not stats.prefix_info
    assert stats.hit_rate_tokens is None
    assert stats.hit_buckets is None
    assert stats.lru_hit_rate_tokens == {100: None}
    assert stats.arrival_rate_rps is None


def test_empty_trace_and_bad_cache_size() -> None:
    with pytest.raises(UserError, match="no requests"):
        compute_stats([])
    with pytest.raises(UserError, match="cache size"):
        compute_stats([_req(0, 0.0, 1, (1,))], cache_tokens=[-1])


def test_mooncake_conversation_figures(conversation_trace: Path) -> None:
    stats = compute_stats(
        read_trace(conversation_trace), cache_tokens=[3_000_000, 10_000_000, 50_000_000]
    )
    assert stats.requests == 12031
    assert stats.input_length.mean == pytest.approx(12035, abs=1)
    assert stats.output_length.mean == pytest.approx(343, abs=1)
    assert stats.hit_rate_tokens == pytest.approx(0.374, abs=0.001)
    lru = stats.lru_hit_rate_tokens
    assert lru[3_000_000] == pytest.approx(0.138, abs=0.001)
    assert lru[10_000_000] == pytest.approx(0.291, abs=0.001)
    assert lru[50_000_000] == pytest.approx(0.371, abs=0.001)


def test_mooncake_conversation_starts_with_block_zero(conversation_trace: Path) -> None:
    requests = list(read_trace(conversation_trace))
    assert all(r.hash_ids[0] == 0 for r in requests)
    assert all(
        (len(r.hash_ids) - 1) * 512 < r.input_length <= len(r.hash_ids) * 512 for r in requests
    )

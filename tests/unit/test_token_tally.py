"""A stream's tokens and gaps, tallied and added to the metrics in steps: the histogram
and counter hold what one observation per token gives, every ``FLUSH_TOKENS`` tokens and
at the end."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from router.service.token_tally import FLUSH_TOKENS, TokenTally

BOUNDS = (0.001, 0.01, 0.1)


def families(registry: CollectorRegistry) -> tuple[Histogram, Counter]:
    itl = Histogram("itl_seconds", "gaps", ["model"], buckets=BOUNDS, registry=registry)
    tokens = Counter("tokens", "tokens", ["model"], registry=registry)
    return itl, tokens


def samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    """Every sample but the creation times."""
    return [(s.name, s.labels, s.value) for m in registry.collect() for s in m.samples
            if not s.name.endswith("_created")]  # fmt: skip


# (tokens, gap): the first batch has no gap; 0.001 and 0.1 fall on bounds (le holds them);
# 0.5 is above every bound
BATCHES = [(3, None), (1, 0.0005), (2, 0.001), (4, 0.05), (1, 0.1), (5, 0.5), (2, 0.002)]


def test_the_tally_adds_what_one_observation_per_token_gives() -> None:
    tallied, observed = CollectorRegistry(), CollectorRegistry()
    itl, tokens = families(tallied)
    tally = TokenTally(itl.labels("m"), tokens.labels("m"), BOUNDS)
    one_itl, one_tokens = families(observed)
    for n, gap in BATCHES:
        tally.add(n, gap)
        one_tokens.labels("m").inc(n)
        for _ in range(n if gap is not None else 0):
            one_itl.labels("m").observe(gap or 0.0)
    tally.flush()
    got, wanted = samples(tallied), samples(observed)
    assert [s[:2] for s in got] == [s[:2] for s in wanted]
    assert [s[2] for s in got] == pytest.approx([s[2] for s in wanted], rel=1e-12)  # the sum
    # by hand: 15 gaps; le=0.001: 1+2, le=0.01: +2, le=0.1: +4+1, +Inf: +5
    buckets = [tallied.get_sample_value("itl_seconds_bucket", {"model": "m", "le": le})
               for le in ("0.001", "0.01", "0.1", "+Inf")]  # fmt: skip
    assert buckets == [3, 5, 10, 15]
    assert tallied.get_sample_value("tokens_total", {"model": "m"}) == 18
    total = 0.0005 + 2 * 0.001 + 4 * 0.05 + 0.1 + 5 * 0.5 + 2 * 0.002
    assert tallied.get_sample_value("itl_seconds_sum", {"model": "m"}) == pytest.approx(total)


def test_a_long_stream_shows_in_the_metrics_every_flush_tokens() -> None:
    registry = CollectorRegistry()
    itl, tokens = families(registry)
    tally = TokenTally(itl.labels("m"), tokens.labels("m"), BOUNDS)
    tally.add(1, None)
    for _ in range(FLUSH_TOKENS - 2):
        tally.add(1, 0.002)
    assert registry.get_sample_value("tokens_total", {"model": "m"}) == 0
    tally.add(1, 0.002)  # the FLUSH_TOKENS-th
    assert registry.get_sample_value("tokens_total", {"model": "m"}) == FLUSH_TOKENS
    count = registry.get_sample_value("itl_seconds_count", {"model": "m"})
    assert count == FLUSH_TOKENS - 1
    tally.add(2, 0.002)
    tally.flush()
    assert registry.get_sample_value("tokens_total", {"model": "m"}) == FLUSH_TOKENS + 2


def test_bounds_other_than_the_histogram_s_are_refused() -> None:
    itl, tokens = families(CollectorRegistry())
    with pytest.raises(ValueError, match="not the histogram's buckets"):
        TokenTally(itl.labels("m"), tokens.labels("m"), (0.001, 0.1))

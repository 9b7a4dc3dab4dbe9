"""Building blocks of the simulator: prefix cache, fluid decode, link sharing, roofline."""

from __future__ import annotations

import pytest

from policies.tiers import Tier
from replay.presets import FluctuationSpec, load_preset
from replay.sim.decode_batch import DecodeBatch
from replay.sim.event_loop import EventLoop
from replay.sim.events import Priority
from replay.sim.fluctuation import Fluctuation
from replay.sim.kv_events import KvEventFeed
from replay.sim.kv_memory import KvMemory
from replay.sim.link import Link, Transfer
from replay.sim.roofline import Roofline
from router.index.base import IndexedInstance
from router.index.memory_index import MemoryPrefixIndex


def test_cache_reports_leading_hits_and_pins_what_it_shares() -> None:
    cache = KvMemory(capacity_tokens=10 * 4, block_size=4)
    assert cache.acquire([1, 2, 3], extra_tokens=0) == 0
    assert cache.acquire([1, 2, 9], extra_tokens=0) == 2
    assert cache.cached_blocks == 4
    assert cache.pinned_tokens == 16
    cache.release([1, 2, 3], 0)
    cache.release([1, 2, 9], 0)
    assert cache.pinned_tokens == 0
    assert cache.used_tokens == 16  # still cached, evictable


def test_cache_evicts_least_recent_leaves_first_and_reports_them() -> None:
    evicted: list[list[int]] = []
    cache = KvMemory(capacity_tokens=4 * 4, block_size=4, on_evict=evicted.append)
    cache.acquire([1, 2, 3], 0)
    cache.release([1, 2, 3], 0)
    cache.acquire([7, 8], 0)  # needs one block beyond capacity: the leaf 3 goes first
    assert evicted == [[3]]
    assert cache.leading_blocks([1, 2, 3]) == 2


def test_cache_refuses_what_cannot_fit_even_after_eviction() -> None:
    cache = KvMemory(capacity_tokens=4 * 4, block_size=4)
    assert cache.acquire([1, 2], extra_tokens=4) == 0
    assert cache.acquire([5, 6], extra_tokens=0) is None  # 3 pinned blocks + 2 > 4
    assert cache.cached_blocks == 2
    cache.release([1, 2], 4)
    assert cache.acquire([5, 6], extra_tokens=0) == 0


def _linear_step(batch: int, context_tokens: float) -> float:
    """A stand-in decode step: 10 ms per running request."""
    return 0.01 * batch


def test_fluid_decode_recomputes_completions_when_membership_changes() -> None:
    loop = EventLoop()
    finished: dict[int, float] = {}
    batch = DecodeBatch(loop, _linear_step, lambda k: finished.update({k: loop.now}))
    loop.at(0.0, Priority.ARRIVAL, lambda _: batch.join(1, 100, 0))
    loop.at(0.5, Priority.ARRIVAL, lambda _: batch.join(2, 10, 0))
    loop.run()
    # A alone at 100 tok/s for 0.5 s (50 tokens); both at 50 tok/s until B's 10 are
    # done at 0.7 s (A at 60); A alone again: 40 tokens at 100 tok/s, done at 1.1 s.
    assert finished[2] == pytest.approx(0.7)
    assert finished[1] == pytest.approx(1.1)
    assert batch.gap_at_exit == {1: pytest.approx(0.02), 2: pytest.approx(0.02)}


def test_a_cancelled_transfer_gives_its_share_back() -> None:
    loop = EventLoop()
    link = Link(loop, "wan", 1e9, rtt_s=0.0)
    done: list[Transfer] = []
    first = link.start(1e9, done.append)
    second = link.start(1e9, done.append)
    loop.at(1.0, Priority.ARRIVAL, lambda _: link.cancel(second))
    loop.run()
    assert done == [first]
    assert first.duration_s == pytest.approx(1.5)  # 0.5 GB shared, then 0.5 GB alone
    assert second.sent_bytes == pytest.approx(0.5e9)
    assert second.done_s is None


def test_fluctuation_is_seeded_and_slows_or_speeds_transfers() -> None:
    spec = FluctuationSpec(period_s=1.0, low=0.2, high=1.0)
    a, b = Fluctuation(spec, seed=7), Fluctuation(spec, seed=7)
    assert [a.multiplier(k) for k in range(5)] == [b.multiplier(k) for k in range(5)]
    loop = EventLoop()
    link = Link(loop, "wan", 1e9, rtt_s=0.0, fluctuation=Fluctuation(spec, seed=7))
    done: list[Transfer] = []
    link.start(2e9, done.append)
    loop.run()
    duration = done[0].duration_s
    assert duration is not None
    assert duration > 2.0
    # bytes moved = sum over whole periods of the multiplier, plus the last partial one
    whole = int(duration)
    moved = sum(a.multiplier(k) for k in range(whole)) + a.multiplier(whole) * (duration - whole)
    assert moved * 1e9 == pytest.approx(2e9)


def _roofline(preset: str, pool: str) -> Roofline:
    cluster = load_preset(preset)
    spec = cluster.spec.pools[pool]
    return Roofline(
        cluster.model,
        cluster.hardware[spec.hardware],
        spec.gpus_per_instance,
        cluster.spec.timing,
        cluster.spec.handoff,
    )


def test_roofline_prefill_pays_only_for_missing_tokens_and_attention_grows_with_context() -> None:
    p = _roofline("pdd", "p")
    cold = p.prefill_s([(16_384, 0)])
    warm = p.prefill_s([(1_024, 15_360)])
    assert warm < cold / 5
    assert p.prefill_s([(1_024, 60_000)]) > p.prefill_s([(1_024, 4_000)])
    assert 0.1 < cold < 2.0


def test_roofline_decode_is_memory_bound_and_faster_on_h200() -> None:
    h100, h200 = _roofline("idc-pd", "md"), _roofline("pdd", "md")
    assert h100.decode_step_s(32, 32 * 8192) > h200.decode_step_s(32, 32 * 8192)
    assert h200.decode_step_s(64, 64 * 8192) > h200.decode_step_s(8, 8 * 8192)
    assert h200.decode_step_s(8, 8 * 65_536) > h200.decode_step_s(8, 8 * 8192)
    assert h200.extend_s(200, 30_000) > h200.extend_s(20, 30_000) > 0.0


def test_kv_events_from_the_other_datacenter_reach_the_index_a_line_later() -> None:

    loop = EventLoop()
    index = MemoryPrefixIndex(clock=loop.clock)
    index.register(IndexedInstance("p-0", Tier.P, "A"))
    index.register(IndexedInstance("md-0", Tier.MD, "B"))
    feed = KvEventFeed(loop, index, 0.05, remote=frozenset({"md-0"}), remote_delay_s=0.1)
    feed.stored("p-0", [1, 2, 3])
    feed.stored("md-0", [1, 2, 3])
    seen: dict[float, dict[str, int]] = {}
    for t in (0.04, 0.06, 0.14, 0.16):
        loop.after(t, Priority.KV_EVENT, lambda at: seen.__setitem__(at, index.match([1, 2, 3])), t)
    loop.run()
    assert seen[0.04] == {"p-0": 0, "md-0": 0}
    assert seen[0.06] == {"p-0": 3, "md-0": 0}  # the local P's events: the base delay
    assert seen[0.14] == {"p-0": 3, "md-0": 0}  # B's MD: the base delay and the line's
    assert seen[0.16] == {"p-0": 3, "md-0": 3}


def test_pages_of_several_blocks_are_shared_only_whole() -> None:
    """Pages of 8 blocks of 16 tokens: a chain that shares only its first block with a
    cached one shares nothing of that page (an engine names a page by all its tokens), one
    that shares the whole first page is served it and holds only its second."""
    cache = KvMemory(capacity_tokens=100 * 128, block_size=16, page_tokens=128)
    first = list(range(16))  # two whole pages
    assert cache.acquire(first, extra_tokens=0) == 0
    assert cache.used_tokens == 256
    parting = [0, *range(101, 116)]  # the first block alike, the first page not
    assert cache.acquire(parting, extra_tokens=0) == 0
    assert cache.used_tokens == 512
    sharing = [*first[:8], *range(200, 208)]  # the first page alike
    assert cache.acquire(sharing, extra_tokens=0) == 8  # hits counted in blocks
    assert cache.used_tokens == 640
    for chain in (first, parting, sharing):
        cache.release(chain, 0)
    assert cache.pinned_tokens == 0
    assert cache.cached_blocks == 5 * 8  # five distinct pages stay cached
    assert cache.leading_blocks([*first[:8], 999]) == 8


def test_blocks_past_a_chains_last_whole_page_are_the_requests_own() -> None:
    """Ten blocks of 16 tokens in pages of 128: the first eight are a page, cached and
    shared; the last two (32 tokens) each request holds for itself, and they are not
    cached once it ends (nor announced as stored)."""
    cache = KvMemory(capacity_tokens=100 * 128, block_size=16, page_tokens=128)
    chain = list(range(10))
    assert cache.kept(chain) == chain[:8]
    assert cache.acquire(chain, extra_tokens=96) == 0
    assert cache.used_tokens == 128 + 32 + 96
    assert cache.acquire(chain, extra_tokens=96) == 8
    assert cache.used_tokens == 128 + 2 * (32 + 96)
    cache.release(chain, 96)
    cache.release(chain, 96)
    assert cache.reserved == 0
    assert cache.used_tokens == 128
    assert cache.leading_blocks(chain) == 8


def test_an_evicted_page_is_reported_as_its_blocks() -> None:
    evicted: list[list[int]] = []
    cache = KvMemory(capacity_tokens=2 * 128, block_size=16, on_evict=evicted.append,
                     page_tokens=128)  # fmt: skip
    first = list(range(16))
    cache.acquire(first, 0)
    cache.release(first, 0)
    cache.acquire(list(range(100, 108)), 0)  # one page more than the memory holds
    assert [sorted(blocks) for blocks in evicted] == [list(range(8, 16))]  # the leaf page
    assert cache.leading_blocks(first) == 8


def test_an_evicted_page_leaves_the_blocks_another_held_page_contains() -> None:
    """Two chains that part within their first page are two pages sharing seven blocks:
    evicting one reports only its own last block, as the other page still holds the rest."""
    evicted: list[list[int]] = []
    cache = KvMemory(capacity_tokens=2 * 128, block_size=16, on_evict=evicted.append,
                     page_tokens=128)  # fmt: skip
    first, second = list(range(8)), [*range(7), 99]
    for chain in (first, second):
        cache.acquire(chain, 0)
        cache.release(chain, 0)
    cache.acquire(list(range(200, 208)), 0)  # room for it: the older page goes
    assert evicted == [[7]]
    assert cache.leading_blocks(second) == 8

"""The simulated engine: toy model, prefix cache, events, timing, waiting and faults."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator

import pytest

from engine_sim.cache import SimEngineCache
from engine_sim.engine import SimEngine, SimEngineConfig, SimFaults
from engine_sim.toy_model import ToyModel
from engines_adapter.contract import EngineError, GenerateRequest, KVEventBatch, TokenDelta


def _req(prompt: list[int], max_tokens: int = 4, rid: str = "r", **kw: object) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid, prompt_token_ids=prompt, max_tokens=max_tokens, ignore_eos=True, **kw
    )


async def _tokens(engine: SimEngine, request: GenerateRequest) -> list[TokenDelta]:
    return [d async for d in engine.generate(request)]


def _prompt(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(512) for _ in range(n)]


class FakeSleep:
    """Records requested sleeps instead of sleeping (time injected)."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)


def test_toy_model_depends_on_the_whole_context() -> None:
    model = ToyModel(vocab_size=512)
    a, b = [1, 2, 3, 4], [9, 2, 3, 4]  # differ only in the first token
    assert model.greedy(a, 8) != model.greedy(b, 8)
    out = model.greedy(a, 10)
    assert model.greedy(a + out[:4], 6) == out[4:]
    assert all(0 <= t < 512 for t in out)


def test_cache_evicts_least_recent_leaves_first_and_reports_removals() -> None:
    cache = SimEngineCache(block_size=2, capacity_blocks=3)
    first = cache.chain([1, 2, 3, 4, 5, 6])  # 3 blocks: fills the cache
    (stored,) = cache.store(first)
    assert stored.type == "BlockStored"
    assert stored.token_ids == [1, 2, 3, 4, 5, 6]
    assert stored.parent_block_hash is None
    second = cache.chain([7, 8])
    stored2, removed = cache.store(second)
    # The deepest block of the older chain goes first, its parents stay.
    assert removed.block_hashes == [first[2].block_hash]
    assert cache.match(first) == 2
    assert stored2.block_hashes == [second[0].block_hash]


def test_pinned_blocks_are_not_evicted() -> None:
    cache = SimEngineCache(block_size=2, capacity_blocks=1)
    held = cache.chain([1, 2])
    cache.store(held, pin=True)
    events = cache.store(cache.chain([3, 4]))
    assert held[0].block_hash in cache
    assert [e.type for e in events] == ["BlockStored", "BlockRemoved"]
    cache.unpin(held)
    cache.store(cache.chain([5, 6]))
    assert held[0].block_hash not in cache


def test_hash_chains_are_deterministic_per_seed() -> None:
    tokens = list(range(8))
    assert SimEngineCache(4, 8).chain(tokens) == SimEngineCache(4, 8).chain(tokens)
    other = SimEngineCache(4, 8, seed=7).chain(tokens)
    assert other[0].block_hash != SimEngineCache(4, 8).chain(tokens)[0].block_hash
    blocks = SimEngineCache(4, 8).chain(tokens)
    assert blocks[1].parent_hash == blocks[0].block_hash


async def test_cached_tokens_keep_the_last_prompt_token_uncached() -> None:
    engine = SimEngine("e", SimEngineConfig(block_size=4))
    prompt = _prompt(8)
    await _tokens(engine, _req(prompt, rid="a"))
    again = await _tokens(engine, _req(prompt, rid="b"))
    assert again[0].cached_tokens == 4  # 2 full blocks cached, the last must be computed
    load = await engine.load()
    assert (load.prefix_cache_queries, load.prefix_cache_hits) == (16.0, 4.0)


async def test_decode_blocks_are_cached_for_the_next_turn() -> None:
    engine = SimEngine("e", SimEngineConfig(block_size=4))
    prompt = _prompt(6)
    out = [
        t for d in await _tokens(engine, _req(prompt, max_tokens=6, rid="a")) for t in d.token_ids
    ]
    follow_up = await _tokens(engine, _req(prompt + out + [1], rid="b"))
    assert follow_up[0].cached_tokens == 12  # 6 prompt + 6 generated tokens = 3 full blocks


async def test_events_published_in_order_with_sequence_numbers() -> None:
    engine = SimEngine("e", SimEngineConfig(block_size=2, cache_blocks=2))
    batches: list[KVEventBatch] = []
    stream = engine.kv_events()
    consumer = asyncio.create_task(_drain(stream, batches))
    await asyncio.sleep(0)
    await _tokens(engine, _req([1, 2, 3, 4], max_tokens=1, rid="a"))
    await _tokens(engine, _req([7, 8], max_tokens=1, rid="b"))
    engine.reset_prefix_cache()
    await asyncio.sleep(0)
    await engine.aclose()
    await consumer
    kinds = [[e.type for e in b.events] for b in batches]
    assert kinds == [["BlockStored"], ["BlockStored", "BlockRemoved"], ["AllBlocksCleared"]]
    assert [b.sequence for b in batches] == [0, 1, 2]
    assert batches[0].events[0].token_ids == [1, 2, 3, 4]
    leaf = engine.cache.chain([1, 2, 3, 4])[1]
    assert batches[1].events[1].block_hashes == [leaf.block_hash]


async def _drain(stream: AsyncIterator[KVEventBatch], into: list[KVEventBatch]) -> None:
    async for batch in stream:
        into.append(batch)


async def test_a_lagging_subscriber_gets_a_gap_marked_batch() -> None:
    engine = SimEngine("e", SimEngineConfig(block_size=2, event_queue_size=1))
    stream = engine.kv_events()
    first_get = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    for i in range(3):  # the queue holds one: the second and third are lost
        await _tokens(engine, _req([10 + i, 20 + i, 30 + i], max_tokens=1, rid=f"r{i}"))
    first = await first_get
    await _tokens(engine, _req([40, 41, 42], max_tokens=1, rid="late"))
    after = await anext(stream)
    assert not first.gap
    assert after.gap
    assert after.missed >= 1
    assert after.events[0].type == "AllBlocksCleared"
    await stream.aclose()


async def test_timing_is_charged_through_the_injected_sleep() -> None:
    sleep = FakeSleep()
    config = SimEngineConfig(block_size=4, prefill_s_per_token=0.001, decode_s_per_token=0.02)
    engine = SimEngine("e", config, sleep=sleep)
    prompt = _prompt(9)
    await _tokens(engine, _req(prompt, max_tokens=3, rid="a"))
    assert sleep.slept == pytest.approx([0.009, 0.02, 0.02, 0.02])
    sleep.slept.clear()
    await _tokens(engine, _req(prompt, max_tokens=1, rid="b"))
    assert sleep.slept[0] == pytest.approx(0.001)  # 8 of 9 tokens came from the cache


async def test_requests_over_max_running_wait() -> None:
    engine = SimEngine("e", SimEngineConfig(max_running=1))
    first = engine.generate(_req([1, 2, 3], max_tokens=100, rid="a"))
    await anext(first)
    second = asyncio.ensure_future(anext(engine.generate(_req([4, 5], rid="b"))))
    await asyncio.sleep(0)
    load = await engine.load()
    assert (load.running, load.waiting) == (1, 1)
    await first.aclose()
    delta = await second
    assert delta.token_ids


async def test_abort_ends_a_stream_with_an_abort_delta_and_frees_it() -> None:
    engine = SimEngine("e")
    stream = engine.generate(_req([1, 2, 3], max_tokens=1000, rid="a"))
    got = [await anext(stream), await anext(stream)]
    await engine.abort("a")
    await engine.abort("unknown")  # ignored
    rest = [d async for d in stream]
    assert rest[-1].finish_reason == "abort"
    assert len([t for d in got + rest for t in d.token_ids]) == 2
    assert (await engine.load()).running == 0


async def test_faults_refuse_fail_midstream_hang_and_health() -> None:
    engine = SimEngine("e", faults=SimFaults(refuse=True, healthy=False))
    assert not await engine.health()
    with pytest.raises(EngineError) as refused:
        await _tokens(engine, _req([1, 2]))
    assert refused.value.retryable

    engine.faults = SimFaults(fail_after_tokens=2)
    stream = engine.generate(_req([1, 2], max_tokens=5, rid="f"))
    got = [await anext(stream), await anext(stream)]
    with pytest.raises(EngineError, match="after 2 tokens"):
        await anext(stream)
    assert all(len(d.token_ids) == 1 for d in got)

    engine.faults = SimFaults(hang=True)
    task = asyncio.ensure_future(_tokens(engine, _req([1, 2], rid="h")))
    await asyncio.sleep(0.01)
    assert not task.done()
    await engine.abort("h")
    assert (await task)[-1].finish_reason == "abort"
    assert (await engine.load()).running == 0


async def test_held_requests_run_but_compute_nothing_until_the_hold_is_lifted() -> None:
    """Held: two prefills are admitted (the engine reports them running) and neither has
    stored a block; lifted, both finish, the second finding the first one's blocks."""
    engine = SimEngine("e", faults=SimFaults(hold=True))
    prompt = _prompt(64)
    first = asyncio.ensure_future(engine.prefill(_req(prompt, rid="a")))
    second = asyncio.ensure_future(engine.prefill(_req(prompt, rid="b")))
    await asyncio.sleep(0.05)
    assert not first.done()
    assert not second.done()
    assert (await engine.load()).running == 2
    assert engine.cache.match(engine.cache.chain(prompt, salt=None)) == 0
    engine.faults = SimFaults()
    done = await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert [r.cached_tokens for r in done] == [0, 48]  # b found a's blocks (never the last)


async def test_out_of_vocabulary_and_empty_prompts_are_not_retryable() -> None:
    engine = SimEngine("e", SimEngineConfig(vocab_size=100))
    for prompt in ([1, 100], [-1]):
        with pytest.raises(EngineError) as bad:
            await engine.prefill(_req(prompt))
        assert not bad.value.retryable
    with pytest.raises(EngineError) as empty:
        await _tokens(engine, _req([]))
    assert not empty.value.retryable


async def test_prefill_returns_first_token_and_transfer_params() -> None:
    engine = SimEngine("p0")
    prompt = _prompt(20)
    result = await engine.prefill(_req(prompt, rid="x"), targets=2)
    assert result.first_token_id == ToyModel().greedy(prompt, 1)[0]
    assert result.kv_transfer_params is not None
    assert result.kv_transfer_params["remote_instance"] == "p0"
    assert result.params_for(1) == result.kv_transfer_params


async def test_decode_with_transferred_kv_skips_prefill_time() -> None:
    sleep = FakeSleep()
    decode = SimEngine("d0", SimEngineConfig(prefill_s_per_token=1.0), sleep=sleep)
    params = {"remote_instance": "p0", "request_id": "x"}
    await _tokens(decode, _req(_prompt(10), max_tokens=1, kv_transfer_params=params))
    assert sleep.slept == []


async def test_eos_stops_unless_ignored() -> None:
    model = ToyModel()
    prompt = [3, 1, 4]
    eos = model.greedy(prompt, 3)[2]
    engine = SimEngine("e", SimEngineConfig(eos_token_id=eos))
    stopped = await _tokens(
        engine, GenerateRequest(request_id="s", prompt_token_ids=prompt, max_tokens=10)
    )
    assert [t for d in stopped for t in d.token_ids] == model.greedy(prompt, 3)
    assert stopped[-1].finish_reason == "stop"
    assert len(await _tokens(engine, _req(prompt, max_tokens=10))) == 10


async def test_closed_engine_ends_event_streams_and_refuses() -> None:
    engine = SimEngine("e")
    stream = engine.kv_events()
    pending = asyncio.ensure_future(anext(stream, None))
    await asyncio.sleep(0)
    await engine.aclose()
    assert await pending is None
    assert not await engine.health()
    with pytest.raises(EngineError):
        await _tokens(engine, _req([1]))
    with contextlib.suppress(StopAsyncIteration):
        await stream.aclose()


async def test_a_cache_salt_isolates_prompts_and_reaches_the_events_as_vllm_sends_it() -> None:
    engine = SimEngine("e", SimEngineConfig(vocab_size=512))
    prompt = _prompt(80)
    batches: list[KVEventBatch] = []
    consumer = asyncio.create_task(_drain(engine.kv_events(), batches))
    await asyncio.sleep(0)
    await _tokens(engine, _req(prompt, 1, "a", sampling={"cache_salt": "tenant-a"}))
    await asyncio.sleep(0)
    stored = batches[0].events[0]
    assert stored.type == "BlockStored"
    assert stored.parent_block_hash is None
    assert stored.extra_keys == [["tenant-a"], None, None, None, None]

    other = await _tokens(engine, _req(prompt, 1, "b", sampling={"cache_salt": "tenant-b"}))
    assert other[0].cached_tokens == 0
    unsalted = await _tokens(engine, _req(prompt, 1, "c"))
    assert unsalted[0].cached_tokens == 0
    again = await _tokens(engine, _req(prompt, 1, "d", sampling={"cache_salt": "tenant-a"}))
    assert again[0].cached_tokens == 64  # 4 whole blocks (the last prompt token is computed)
    await engine.aclose()
    await consumer

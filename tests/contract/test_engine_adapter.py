"""One contract suite for every engine adapter: what the orchestrator relies on.

Implementations: the in-process simulated engine; the vLLM adapter against the
simulated engine's HTTP server (uvicorn in a thread); the vLLM adapter against a
real vLLM on CPU (marked ``vllm``; started only when ``PDD_ROUTER_TEST_VLLM=1``,
from the venv of ``scripts/ensure-vllm.sh``, with the tiny random-weight model of
tests/integration/vllm_model).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import httpx
import pytest
import uvicorn

from engine_sim.engine import SimEngine, SimEngineConfig
from engine_sim.server import SimServerConfig, create_app
from engines_adapter.contract import (
    EngineAdapter,
    EngineError,
    GenerateRequest,
    KVEventBatch,
    TokenDelta,
)
from engines_adapter.kv_events import KVEventDecoder, encode_batch
from engines_adapter.vllm import VLLMAdapter
from vllm_launcher import Endpoint, free_port

VOCAB = 512  # the tiny model's vocabulary, and the simulated engines'

IMPLEMENTATIONS = ["sim", "vllm-sim-http", pytest.param("vllm", marks=pytest.mark.vllm)]


# -- servers (one per session) ------------------------------------------------------


@pytest.fixture(scope="session")
def sim_http_server() -> Iterator[Endpoint]:
    """The simulated engine behind uvicorn in a thread (2 ms per decoded token)."""
    port, kv_port = free_port(), free_port()
    config = SimServerConfig(
        instance_id="sim-http",
        engine=SimEngineConfig(block_size=16, vocab_size=VOCAB, decode_s_per_token=0.002),
        kv_events_endpoint=f"tcp://127.0.0.1:{kv_port}",
    )
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config), host="127.0.0.1", port=port, log_level="warning", ws="none"
        )
    )
    thread = threading.Thread(target=server.run, name="sim-http-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the simulated engine server did not start")
        time.sleep(0.02)
    yield Endpoint(f"http://127.0.0.1:{port}", f"tcp://127.0.0.1:{kv_port}")
    server.should_exit = True
    thread.join(20)


# -- the harness ----------------------------------------------------------------------


@dataclass
class Harness:
    name: str
    adapter: EngineAdapter
    block_size: int
    timeout_s: float
    # whether load() sees a request while it runs: vLLM's running and KV-usage gauges
    # were seen to stay at 0 through a 10 s burst of six requests on the CPU (its
    # counters catch up when the burst ends), which is why the router also counts its
    # own requests in flight (router.service.pool)
    live_gauges: bool = True

    def prompt(self, n: int) -> list[int]:
        rng = random.Random(uuid.uuid4().int)
        return [rng.randrange(3, VOCAB) for _ in range(n)]

    def request(self, prompt: list[int], max_tokens: int, **kw: object) -> GenerateRequest:
        return GenerateRequest(
            request_id=f"ct-{uuid.uuid4().hex[:12]}",
            prompt_token_ids=prompt,
            max_tokens=max_tokens,
            temperature=0.0,
            ignore_eos=True,
            **kw,
        )


@pytest.fixture(params=IMPLEMENTATIONS)
async def h(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    kind = request.param
    if kind == "sim":
        engine = SimEngine("sim", SimEngineConfig(block_size=16, vocab_size=VOCAB))
        yield Harness(kind, engine, 16, 30)
        await engine.aclose()
        return
    endpoint: Endpoint = request.getfixturevalue(
        "sim_http_server" if kind == "vllm-sim-http" else "vllm_endpoint"
    )
    async with httpx.AsyncClient() as client:
        adapter = VLLMAdapter(
            kind,
            endpoint.url,
            client=client,
            kv_events_endpoint=endpoint.kv_events,
            kv_replay_endpoint=endpoint.kv_replay,
            vocab_size=VOCAB if kind == "vllm" else None,  # the sim server checks itself
            # two CPU vLLMs and the tests share 2 cores: a busy engine may take seconds
            # to accept a connection, which production probes rightly call a timeout
            timeout=httpx.Timeout(connect=30.0, read=180.0, write=30.0, pool=30.0),
            probe_timeout=httpx.Timeout(30.0),
        )
        sim = kind == "vllm-sim-http"
        yield Harness(kind, adapter, 16 if sim else 128, 30 if sim else 180, live_gauges=sim)
        await adapter.aclose()


async def run(adapter: EngineAdapter, request: GenerateRequest) -> list[TokenDelta]:
    stream = adapter.generate(request)
    try:
        return [delta async for delta in stream]
    finally:
        await stream.aclose()


def tokens(deltas: list[TokenDelta]) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


# -- the contract ---------------------------------------------------------------------


async def test_generate_streams_max_tokens(h: Harness) -> None:
    async with asyncio.timeout(h.timeout_s):
        deltas = await run(h.adapter, h.request(h.prompt(40), 12))
    assert len(tokens(deltas)) == 12
    assert all(0 <= t < VOCAB for t in tokens(deltas))
    assert deltas[-1].finished
    assert deltas[-1].finish_reason == "length"
    assert not any(d.finished for d in deltas[:-1])


async def test_greedy_decoding_is_deterministic(h: Harness) -> None:
    prompt = h.prompt(40)
    async with asyncio.timeout(h.timeout_s):
        first = tokens(await run(h.adapter, h.request(prompt, 10)))
        second = tokens(await run(h.adapter, h.request(prompt, 10)))
    assert first == second


async def test_extend_decode_continues_exactly(h: Harness) -> None:
    prompt = h.prompt(50)
    async with asyncio.timeout(h.timeout_s):
        full = tokens(await run(h.adapter, h.request(prompt, 16)))
        resumed = tokens(await run(h.adapter, h.request(prompt + full[:6], 10)))
    assert resumed == full[6:]


async def test_cached_tokens_grow_on_a_repeated_prefix(h: Harness) -> None:
    prompt = h.prompt(3 * h.block_size + 5)
    async with asyncio.timeout(h.timeout_s):
        before = await h.adapter.load()
        cold = await run(h.adapter, h.request(prompt, 2))
        warm = await run(h.adapter, h.request(prompt, 2))
        after = await h.adapter.load()
    cold_cached = next(d.cached_tokens for d in cold if d.cached_tokens is not None)
    warm_cached = next(d.cached_tokens for d in warm if d.cached_tokens is not None)
    assert cold_cached < warm_cached
    assert warm_cached == 3 * h.block_size
    assert after.prefix_cache_queries - before.prefix_cache_queries >= 2 * len(prompt)
    assert after.prefix_cache_hits - before.prefix_cache_hits >= 3 * h.block_size


async def test_prefill_returns_the_first_token_of_a_generate(h: Harness) -> None:
    prompt = h.prompt(40)
    async with asyncio.timeout(h.timeout_s):
        prefill = await h.adapter.prefill(h.request(prompt, 8), targets=1)
        plain = tokens(await run(h.adapter, h.request(prompt, 8)))
        params = prefill.params_for(0)
        handed = tokens(await run(h.adapter, h.request(prompt, 8, kv_transfer_params=params)))
    assert prefill.first_token_id == plain[0]
    assert handed == plain  # a decode target given the prefill's params continues the same


async def test_abort_stops_a_stream(h: Harness) -> None:
    request = h.request(h.prompt(30), 3000)
    async with asyncio.timeout(h.timeout_s):
        stream = h.adapter.generate(request)
        head = [await anext(stream), await anext(stream)]
        await h.adapter.abort(request.request_id)
        await h.adapter.abort("no-such-request")  # ignored
        rest = [d async for d in stream]
        while (await h.adapter.load()).running:  # the engine stops, not just the client
            await asyncio.sleep(0.05)
    assert rest[-1].finished
    assert rest[-1].finish_reason == "abort"
    assert len(tokens(head + rest)) < 3000


async def test_load_figures_move(h: Harness) -> None:
    request = h.request(h.prompt(30), 3000)
    async with asyncio.timeout(h.timeout_s):
        before = await h.adapter.load()
        stream = h.adapter.generate(request)
        await anext(stream)
        if h.live_gauges:  # the request shows while it runs
            while (busy := await h.adapter.load()).running < 1:
                await asyncio.sleep(0.05)
            assert busy.kv_usage > 0
            await h.adapter.abort(request.request_id)
        _ = [d async for d in stream]
        # the counters move once the engine has recorded the request
        while (after := await h.adapter.load()).prefix_cache_queries <= (
            before.prefix_cache_queries
        ):
            await asyncio.sleep(0.1)
    assert after.block_size == h.block_size


async def test_health_is_true(h: Harness) -> None:
    async with asyncio.timeout(h.timeout_s):
        assert await h.adapter.health()


async def test_kv_events_arrive_for_a_stored_prompt(h: Harness) -> None:
    queue: asyncio.Queue[KVEventBatch] = asyncio.Queue()

    async def listen() -> None:
        async for batch in h.adapter.kv_events():
            await queue.put(batch)

    listener = asyncio.create_task(listen())
    bs = h.block_size
    stored: dict[tuple[int, ...], KVEventBatch] = {}
    try:
        async with asyncio.timeout(h.timeout_s):
            await asyncio.sleep(0)
            # A subscriber misses what was published before it joined (ZMQ's slow
            # joiner): send fresh prompts until one's blocks are reported.
            while True:
                prompt = h.prompt(2 * bs + 1)
                await run(h.adapter, h.request(prompt, 1))
                with contextlib.suppress(TimeoutError):
                    while True:
                        batch = await asyncio.wait_for(queue.get(), 1.0)
                        for event in batch.events:
                            if event.type == "BlockStored":
                                for i in range(0, len(event.token_ids), bs):
                                    stored[tuple(event.token_ids[i : i + bs])] = batch
                        if tuple(prompt[:bs]) in stored and tuple(prompt[bs : 2 * bs]) in stored:
                            break
                    break
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
    batch = stored[tuple(prompt[:bs])]
    assert batch.instance_id == h.name
    event = next(e for e in batch.events if e.type == "BlockStored")
    assert event.block_size == bs
    assert len(event.block_hashes) * bs == len(event.token_ids)
    # The batch survives the wire format both ways (what the simulated publisher sends).
    for form in ("map", "array"):
        again = KVEventDecoder(h.name).decode(encode_batch(batch.events, form=form))
        assert again.events == batch.events


async def test_out_of_vocabulary_tokens_are_refused_for_good(h: Harness) -> None:
    async with asyncio.timeout(h.timeout_s):
        with pytest.raises(EngineError) as generate_error:
            await run(h.adapter, h.request([5, 6, VOCAB + 3], 4))
        with pytest.raises(EngineError) as prefill_error:
            await h.adapter.prefill(h.request([VOCAB], 4))
        assert await h.adapter.health()  # and the engine is still up
    assert not generate_error.value.retryable
    assert not prefill_error.value.retryable

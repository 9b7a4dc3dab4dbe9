"""The simulated engine's HTTP server (vLLM's shapes) and the adapter factory."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from engine_sim.engine import SimEngine, SimEngineConfig
from engine_sim.server import SimServerConfig, create_app
from engine_sim.toy_model import ToyModel
from engines_adapter.contract import GenerateRequest
from engines_adapter.engine_metrics import parse_load
from engines_adapter.sglang import SGLangAdapter
from engines_adapter.vllm import VLLMAdapter
from replay.runner.engine_clock import DECODE, PREFILL, read_totals
from router.adapter_factory import build_adapter, engine_http_client

PROMPT = list(range(10, 30))


@contextlib.asynccontextmanager
async def in_process(engine: SimEngineConfig) -> AsyncIterator[httpx.AsyncClient]:
    """The app in process: its lifespan run by hand, its state put in each scope."""
    app: FastAPI = create_app(SimServerConfig(instance_id="p-1", engine=engine))
    async with app.router.lifespan_context(app) as state:

        async def with_state(scope: Scope, receive: Receive, send: Send) -> None:
            scope["state"] = dict(state or {})
            await app(scope, receive, send)

        transport = httpx.ASGITransport(app=with_state)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as c:
            yield c


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with in_process(SimEngineConfig(block_size=4)) as c:
        yield c


def _events(text: str) -> list[Any]:
    out: list[Any] = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_completion_returns_token_ids_usage_and_transfer_params(
    client: httpx.AsyncClient,
) -> None:
    body = {"prompt": PROMPT, "max_tokens": 5, "return_token_ids": True,
            "kv_transfer_params": {"do_remote_decode": True}}  # fmt: skip
    first = (await client.post("/v1/completions", json=body)).json()
    again = (await client.post("/v1/completions", json=body)).json()
    choice = first["choices"][0]
    assert choice["token_ids"] == ToyModel().greedy(PROMPT, 5)
    assert choice["finish_reason"] == "length"
    assert first["object"] == "text_completion"
    assert first["usage"]["prompt_tokens"] == 20
    assert first["usage"]["completion_tokens"] == 5
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": 16}
    assert first["kv_transfer_params"]["remote_instance"] == "p-1"


async def test_streaming_sends_sse_chunks_then_usage_then_done(client: httpx.AsyncClient) -> None:
    body = {"prompt": PROMPT, "max_tokens": 3, "stream": True, "return_token_ids": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _events((await response.aread()).decode())
    *chunks, usage, done = events
    assert done == "[DONE]"
    assert [c["choices"][0]["token_ids"] for c in chunks] == [
        [t] for t in ToyModel().greedy(PROMPT, 3)
    ]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == PROMPT
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 3


async def test_faults_over_http(client: httpx.AsyncClient) -> None:
    assert (await client.post("/sim/faults", json={"refuse": True})).status_code == 200
    refused = await client.post("/v1/completions", json={"prompt": PROMPT})
    assert refused.status_code == 503
    assert refused.json()["error"]["type"] == "ServiceUnavailableError"
    await client.post("/sim/faults", json={"fail_after_tokens": 1})
    body = {"prompt": PROMPT, "stream": True}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        events = _events((await r.aread()).decode())
    assert "error" in events[-2]
    assert events[-1] == "[DONE]"
    await client.post("/sim/faults", json={"healthy": False})
    assert (await client.get("/health")).status_code == 503


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "text prompts need a tokenizer"},
        {"prompt": [[1, 2], [3]]},
        {"prompt": [1, 2], "max_tokens": 0},
        {"prompt": [1, 600]},
    ],
)
async def test_bad_requests_get_400_in_openai_error_shape(
    client: httpx.AsyncClient, body: Any
) -> None:
    response = await client.post("/v1/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == 400
    assert error["type"] == "BadRequestError"


async def test_metrics_use_vllm_names(client: httpx.AsyncClient) -> None:
    await client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
    text = (await client.get("/metrics")).text
    assert "vllm:prefix_cache_queries_total" in text
    load = parse_load(text)
    assert (load.prefix_cache_queries, load.block_size, load.num_blocks) == (20.0, 4, 4096)


async def test_metrics_time_each_request_as_vllm_does() -> None:
    """Seconds from a slot to the first token (the prefill: 20 tokens at 1 ms, then the
    first decode step of 5 ms) and from the first to the last (4 more steps), summed over
    requests in vLLM's histograms, which `calibrate` reads as the engine's own clock.

    The engine sleeps its step times, so a loaded machine can only make them longer:
    each is bounded below by the model's time and, both together, above by the client's
    own round trip (not by a wall-clock guess that a busy machine overshoots)."""
    engine = SimEngineConfig(block_size=4, prefill_s_per_token=0.001, decode_s_per_token=0.005)
    round_trips = []
    async with in_process(engine) as c:
        before = await read_totals(c, "http://sim")
        for prompt in (PROMPT, [p + 100 for p in PROMPT]):
            started = time.perf_counter()
            await c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 5})
            round_trips.append(time.perf_counter() - started)
        after = await read_totals(c, "http://sim")
    assert before is not None
    assert after is not None
    assert after.counted_since(before, PREFILL) == after.counted_since(before, DECODE) == 2
    prefill, decode = after.mean_since(before, PREFILL), after.mean_since(before, DECODE)
    assert prefill >= 0.025  # 20 prompt tokens at 1 ms and the first 5 ms step
    assert decode >= 0.020  # the 4 steps after the first token
    assert prefill + decode <= sum(round_trips) / len(round_trips)


async def test_reset_prefix_cache(client: httpx.AsyncClient) -> None:
    body = {"prompt": PROMPT, "max_tokens": 1}
    await client.post("/v1/completions", json=body)
    assert (await client.post("/reset_prefix_cache")).status_code == 200
    again = (await client.post("/v1/completions", json=body)).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def test_factory_builds_each_kind() -> None:
    assert isinstance(build_adapter("sim", "s"), SimEngine)
    async with engine_http_client() as http:
        assert isinstance(build_adapter("vllm", "v", "http://x:1", client=http), VLLMAdapter)
        sglang = build_adapter("sglang", "g", "http://x:2", client=http, bootstrap_port=8998)
        assert isinstance(sglang, SGLangAdapter)
        assert sglang.bootstrap_port == 8998
        with pytest.raises(ValueError, match="URL"):
            build_adapter("vllm", "v", client=http)
    with pytest.raises(ValueError, match="httpx"):
        build_adapter("vllm", "v", "http://x:1")
    assert isinstance(engine_http_client(), httpx.AsyncClient)


async def test_metrics_count_inter_token_gaps_as_vllm_does() -> None:
    """vLLM's inter-token latency histogram: the seconds between a request's tokens and
    how many gaps (tokens after the first), which the router reads as the step time."""
    engine = SimEngineConfig(block_size=4, decode_s_per_token=0.005)
    async with in_process(engine) as c:
        for prompt in (PROMPT, [p + 100 for p in PROMPT]):
            await c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 5})
        load = parse_load((await c.get("/metrics")).text)
    assert load.itl_count == 8  # 4 gaps a request
    assert 8 * 0.005 <= load.itl_sum_s < 8 * 0.5


async def test_inter_token_gaps_count_while_a_request_is_still_generating() -> None:
    """As vLLM observes them each step: a router reading the step time of an engine busy
    with long generations sees it grow before any of them ends."""
    sim = SimEngine("md0", SimEngineConfig(block_size=4, decode_s_per_token=0.005))
    request = GenerateRequest(request_id="r", prompt_token_ids=PROMPT, max_tokens=400,
                              ignore_eos=True)  # fmt: skip
    deltas = sim.generate(request)
    try:
        for _ in range(11):  # the first token, then ten gaps
            await anext(deltas)
        load = sim.snapshot()
    finally:
        await deltas.aclose()
        await sim.aclose()
    assert load.running == 1  # still generating
    assert load.itl_count == 10
    assert 10 * 0.005 <= load.itl_sum_s < 10 * 0.5

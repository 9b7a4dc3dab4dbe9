"""The SGLang adapter against respx, on SGLang's documented /generate shapes and PD bootstrap."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import respx
from adapter_errors import errors_of

from engines_adapter.contract import EngineError, GenerateRequest, TokenDelta
from engines_adapter.sglang import SGLangAdapter

BASE = "http://sglang-p.test:30000"
GENERATE = f"{BASE}/generate"


def _req(**kw: Any) -> GenerateRequest:
    return GenerateRequest(
        request_id="r1", prompt_token_ids=[1, 2, 3, 4], max_tokens=3, ignore_eos=True, **kw
    )


def _meta(completion: int, finish: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": "r1", "finish_reason": finish, "prompt_tokens": 4,
            "completion_tokens": completion, "cached_tokens": 2}  # fmt: skip


def _sse(*chunks: dict[str, Any] | str) -> bytes:
    return "".join(
        f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n" for c in chunks
    ).encode()


LENGTH = {"type": "length", "length": 3}


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as c:
        yield c


async def _collect(adapter: SGLangAdapter, request: GenerateRequest) -> list[TokenDelta]:
    return [d async for d in adapter.generate(request)]


@respx.mock
async def test_generate_sends_input_ids_and_reads_cumulative_output_ids(
    client: httpx.AsyncClient,
) -> None:
    route = respx.post(GENERATE).mock(
        return_value=httpx.Response(
            200,
            content=_sse(
                {"output_ids": [7], "meta_info": _meta(1)},
                {"output_ids": [7, 8], "meta_info": _meta(2)},
                {"output_ids": [7, 8, 9], "meta_info": _meta(3, LENGTH)},
                "[DONE]",
            ),
        )
    )
    adapter = SGLangAdapter("s0", BASE, client=client)
    deltas = await _collect(adapter, _req(temperature=0.0))
    body = json.loads(route.calls.last.request.content)
    assert body == {
        "input_ids": [1, 2, 3, 4],
        "sampling_params": {"max_new_tokens": 3, "temperature": 0.0, "ignore_eos": True},
        "rid": "r1",
        "stream": True,
    }
    # the deltas an engine sent while nobody read are read as one (as vLLM merges them)
    assert [t for d in deltas for t in d.token_ids] == [7, 8, 9]
    assert [d.cached_tokens for d in deltas if d.cached_tokens is not None] == [2]
    assert (deltas[-1].finished, deltas[-1].finish_reason) == (True, "length")


@respx.mock
async def test_generate_reads_incremental_output_ids(client: httpx.AsyncClient) -> None:
    respx.post(GENERATE).mock(
        return_value=httpx.Response(
            200,
            content=_sse(
                {"output_ids": [7], "meta_info": _meta(1)},
                {"output_ids": [8, 9], "meta_info": _meta(3, LENGTH)},
                "[DONE]",
            ),
        )
    )
    deltas = await _collect(SGLangAdapter("s0", BASE, client=client), _req())
    assert [t for d in deltas for t in d.token_ids] == [7, 8, 9]


@respx.mock
async def test_prefill_without_pd_is_a_one_token_generation(client: httpx.AsyncClient) -> None:
    route = respx.post(GENERATE).mock(
        return_value=httpx.Response(200, json={"output_ids": [42], "meta_info": _meta(1, LENGTH)})
    )
    result = await SGLangAdapter("s0", BASE, client=client).prefill(_req())
    body = json.loads(route.calls.last.request.content)
    assert body["sampling_params"]["max_new_tokens"] == 1
    assert body["stream"] is False
    assert "bootstrap_room" not in body
    assert (result.first_token_id, result.cached_tokens, result.kv_transfer_params) == (
        42,
        2,
        None,
    )


@respx.mock
async def test_pd_prefill_opens_one_bootstrap_room_per_decode_target(
    client: httpx.AsyncClient,
) -> None:
    prefill_route = respx.post(GENERATE).mock(
        return_value=httpx.Response(200, json={"output_ids": [42], "meta_info": _meta(1, LENGTH)})
    )
    decode_url = "http://sglang-d.test:30001/generate"
    decode_route = respx.post(decode_url).mock(
        return_value=httpx.Response(
            200,
            content=_sse({"output_ids": [42, 8, 9], "meta_info": _meta(3, LENGTH)}, "[DONE]"),
        )
    )
    prefill = SGLangAdapter("p0", BASE, client=client, bootstrap_port=8998, rng=random.Random(1))
    decode = SGLangAdapter("d0", "http://sglang-d.test:30001", client=client)

    result = await prefill.prefill(_req(), targets=2)
    assert result.first_token_id is None  # the decode stream carries it
    rooms = [p["bootstrap_room"] for p in result.target_kv_params]
    assert len(set(rooms)) == 2
    assert all(0 <= r < 2**63 for r in rooms)
    assert result.params_for(0) == {
        "bootstrap_host": "sglang-p.test",
        "bootstrap_port": 8998,
        "bootstrap_room": rooms[0],
    }
    deltas = await _collect(decode, _req(kv_transfer_params=result.params_for(1)))
    await prefill.aclose()  # waits for the background prefill requests

    decode_body = json.loads(decode_route.calls.last.request.content)
    assert decode_body["bootstrap_room"] == rooms[1]
    assert decode_body["bootstrap_host"] == "sglang-p.test"
    prefill_bodies = [json.loads(c.request.content) for c in prefill_route.calls]
    assert sorted(b["bootstrap_room"] for b in prefill_bodies) == sorted(rooms)
    assert {b["rid"] for b in prefill_bodies} == {"r1-p0", "r1-p1"}
    assert [t for d in deltas for t in d.token_ids] == [42, 8, 9]


@pytest.mark.parametrize(
    ("response", "retryable"),
    [
        (httpx.ConnectError("refused"), True),
        (httpx.Response(500, text="Internal Server Error"), True),
        (httpx.Response(400, json={"error": {"message": "input_ids too long"}}), False),
    ],
)
@respx.mock
async def test_errors_map_to_engine_errors(
    client: httpx.AsyncClient, response: httpx.Response | Exception, retryable: bool
) -> None:
    adapter = SGLangAdapter("s0", BASE, client=client)
    from_generate, from_prefill = await errors_of(adapter, respx.post(GENERATE), response, _req())
    assert from_generate.retryable is retryable
    assert from_prefill.retryable is retryable


@respx.mock
async def test_an_error_chunk_raises(client: httpx.AsyncClient) -> None:
    respx.post(GENERATE).mock(
        return_value=httpx.Response(200, content=_sse({"error": {"message": "oom"}}, "[DONE]"))
    )
    with pytest.raises(EngineError, match="oom"):
        await _collect(SGLangAdapter("s0", BASE, client=client), _req())


SGLANG_METRICS_TEXT = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 4.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 2.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.4
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m"} 0.5
# TYPE sglang:prompt_tokens counter
sglang:prompt_tokens_total{model_name="m"} 4096.0
# TYPE sglang:cached_tokens counter
sglang:cached_tokens_total{cache_source="device",model_name="m"} 3000.0
sglang:cached_tokens_total{cache_source="host",model_name="m"} 168.0
"""


@respx.mock
async def test_load_comes_from_sglang_metrics(client: httpx.AsyncClient) -> None:
    respx.get(f"{BASE}/metrics").mock(return_value=httpx.Response(200, text=SGLANG_METRICS_TEXT))
    load = await SGLangAdapter("s0", BASE, client=client).load()
    assert (load.running, load.waiting, load.kv_usage) == (4, 2, 0.4)
    assert (load.prefix_cache_queries, load.prefix_cache_hits) == (4096.0, 3168.0)


@respx.mock
async def test_load_without_metrics_says_how_to_enable_them(client: httpx.AsyncClient) -> None:
    respx.get(f"{BASE}/metrics").mock(return_value=httpx.Response(404))
    with pytest.raises(EngineError, match="--enable-metrics"):
        await SGLangAdapter("s0", BASE, client=client).load()


@respx.mock
async def test_health(client: httpx.AsyncClient) -> None:
    respx.get(f"{BASE}/health").mock(side_effect=[httpx.Response(200), httpx.Response(503)])
    adapter = SGLangAdapter("s0", BASE, client=client)
    assert await adapter.health()
    assert not await adapter.health()

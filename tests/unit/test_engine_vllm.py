"""The vLLM adapter against respx: request shapes, SSE parsing, error mapping, metrics, abort."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import respx
from adapter_errors import errors_of

from engines_adapter.contract import EngineError, GenerateRequest, TokenDelta
from engines_adapter.engine_metrics import parse_load
from engines_adapter.vllm import VLLMAdapter

BASE = "http://vllm.test:8000"
COMPLETIONS = f"{BASE}/v1/completions"


def _req(prompt: list[int] | None = None, **kw: Any) -> GenerateRequest:
    return GenerateRequest(
        request_id="r1", prompt_token_ids=prompt or [1, 2, 3], max_tokens=3, ignore_eos=True, **kw
    )


def _sse(*chunks: dict[str, Any] | str) -> bytes:
    lines = [f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n" for c in chunks]
    return "".join(lines).encode()


def _chunk(token_ids: list[int], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "text": "", "token_ids": token_ids, "finish_reason": finish}
    return {"id": "cmpl-r1", "object": "text_completion", "model": "m", "choices": [choice]}


USAGE = {
    "id": "cmpl-r1",
    "choices": [],
    "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6,
              "prompt_tokens_details": {"cached_tokens": 2}},
}  # fmt: skip


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as c:
        yield c


@pytest.fixture
def adapter(client: httpx.AsyncClient) -> VLLMAdapter:
    return VLLMAdapter("v0", BASE, client=client, model="m")


async def _collect(adapter: VLLMAdapter, request: GenerateRequest) -> list[TokenDelta]:
    return [d async for d in adapter.generate(request)]


@respx.mock
async def test_generate_sends_token_ids_and_parses_the_stream(adapter: VLLMAdapter) -> None:
    route = respx.post(COMPLETIONS).mock(
        return_value=httpx.Response(
            200,
            content=_sse(_chunk([7]), _chunk([8, 9]), _chunk([], "length"), USAGE, "[DONE]"),
            headers={"content-type": "text/event-stream"},
        )
    )
    params = {"remote_engine_id": "p0", "remote_block_ids": [1]}
    deltas = await _collect(adapter, _req(kv_transfer_params=params))
    body = json.loads(route.calls.last.request.content)
    assert body["prompt"] == [1, 2, 3]
    assert body["model"] == "m"
    assert body["return_token_ids"] is True
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["kv_transfer_params"] == params
    assert route.calls.last.request.headers["x-request-id"] == "r1"
    # the deltas an engine sent while nobody read are read as one (as vLLM merges them)
    assert [t for d in deltas for t in d.token_ids] == [7, 8, 9]
    assert deltas[-1].finished
    assert deltas[-1].finish_reason == "length"
    # with KV handed over by a connector, vLLM's cached tokens count the transferred ones:
    # not a prefix-cache hit, so none is reported (the router reads the KV events instead)
    assert deltas[-1].cached_tokens is None
    plain = await _collect(adapter, _req())
    assert "kv_transfer_params" not in json.loads(route.calls.last.request.content)
    assert plain[-1].cached_tokens == 2  # from the usage chunk after the last token


@respx.mock
async def test_prefill_asks_for_remote_decode_and_returns_the_engines_params(
    adapter: VLLMAdapter,
) -> None:
    kv = {"do_remote_prefill": True, "remote_engine_id": "e1", "remote_block_ids": [3, 4]}
    route = respx.post(COMPLETIONS).mock(
        return_value=httpx.Response(
            200,
            json={
                "choices": [{"index": 0, "text": "", "token_ids": [42], "finish_reason": "length"}],
                "usage": USAGE["usage"],
                "kv_transfer_params": kv,
            },
        )
    )
    result = await adapter.prefill(_req(), targets=2)
    body = json.loads(route.calls.last.request.content)
    assert body["max_tokens"] == 1
    assert body["stream"] is False
    assert body["kv_transfer_params"]["do_remote_decode"] is True
    assert (result.first_token_id, result.cached_tokens) == (42, 2)
    assert result.kv_transfer_params == kv
    assert result.params_for(1) == kv


@respx.mock
async def test_prefill_works_when_the_engine_ignores_transfer_params(adapter: VLLMAdapter) -> None:
    respx.post(COMPLETIONS).mock(
        return_value=httpx.Response(200, json={"choices": [{"token_ids": [5]}], "usage": {}})
    )
    result = await adapter.prefill(_req())
    assert (result.first_token_id, result.kv_transfer_params, result.cached_tokens) == (
        5,
        None,
        None,
    )


@respx.mock
async def test_an_engine_without_token_ids_is_the_instances_fault(adapter: VLLMAdapter) -> None:
    """A vLLM started without return_token_ids cannot serve anyone: held against it (its
    breaker opens), never blamed on the client, whom another instance may serve."""
    respx.post(COMPLETIONS).mock(return_value=httpx.Response(200, json={"choices": [{}]}))
    with pytest.raises(EngineError, match="token_ids") as err:
        await adapter.prefill(_req())
    assert err.value.cause == "instance"
    assert err.value.held_against_instance
    assert "token_ids" not in err.value.public  # what the client is told: nothing internal


@respx.mock
async def test_a_refusal_is_the_clients_error_told_in_the_engines_words(
    adapter: VLLMAdapter,
) -> None:
    body = {"error": {"message": "maximum context length is 512 tokens\x00", "code": 400}}
    respx.post(COMPLETIONS).mock(return_value=httpx.Response(400, json=body))
    with pytest.raises(EngineError) as err:
        await adapter.prefill(_req())
    assert err.value.cause == "request"
    assert not err.value.held_against_instance
    assert (
        err.value.public == "the engine refused the request: maximum context length is 512 tokens"
    )


@respx.mock
async def test_an_error_body_that_is_not_openai_shaped_is_not_shown(adapter: VLLMAdapter) -> None:
    leak = "<html>internal proxy db_password=hunter2</html>"
    respx.post(COMPLETIONS).mock(return_value=httpx.Response(403, text=leak))
    with pytest.raises(EngineError) as err:
        await adapter.prefill(_req())
    assert err.value.cause == "request"
    assert "hunter2" not in err.value.public
    assert err.value.public == "the engine refused the request: HTTP 403"
    respx.post(COMPLETIONS).mock(return_value=httpx.Response(500, text=leak))
    with pytest.raises(EngineError) as failed:
        await adapter.prefill(_req())
    assert failed.value.cause == "instance"
    assert "hunter2" not in failed.value.public


@pytest.mark.parametrize(
    ("response", "retryable"),
    [
        (httpx.ConnectError("refused"), True),
        (httpx.ReadTimeout("slow"), True),
        (httpx.Response(500, json={"error": {"message": "boom", "code": 500}}), True),
        (httpx.Response(503, text="overloaded"), True),
        (httpx.Response(429, json={"error": {"message": "busy"}}), True),
        (httpx.Response(400, json={"error": {"message": "bad prompt", "code": 400}}), False),
        (httpx.Response(404, json={"detail": "Not Found"}), False),
    ],
)
@respx.mock
async def test_errors_map_to_engine_errors(
    adapter: VLLMAdapter, response: httpx.Response | Exception, retryable: bool
) -> None:
    from_generate, from_prefill = await errors_of(
        adapter, respx.post(COMPLETIONS), response, _req()
    )
    assert from_generate.retryable is retryable
    assert from_prefill.retryable is retryable
    assert from_generate.instance_id == "v0"


@respx.mock
async def test_a_429_is_the_engine_busy_not_a_fault_of_the_instance(adapter: VLLMAdapter) -> None:
    respx.post(COMPLETIONS).mock(return_value=httpx.Response(429, json={"error": {"message": "x"}}))
    with pytest.raises(EngineError) as busy:
        await _collect(adapter, _req())
    assert (busy.value.cause, busy.value.retryable) == ("busy", True)
    assert busy.value.held_against_instance is False  # never opens its breaker
    assert busy.value.public == "the engine is busy"


@respx.mock
async def test_error_message_of_the_body_is_kept(adapter: VLLMAdapter) -> None:
    body = {"error": {"message": "prompt too long", "type": "BadRequestError", "code": 400}}
    respx.post(COMPLETIONS).mock(return_value=httpx.Response(400, json=body))
    with pytest.raises(EngineError, match="HTTP 400: prompt too long"):
        await _collect(adapter, _req())


@pytest.mark.parametrize(("code", "retryable"), [(500, True), (429, True), (400, False)])
@respx.mock
async def test_an_error_chunk_in_the_stream_raises(
    adapter: VLLMAdapter, code: int, retryable: bool
) -> None:
    error = {"error": {"message": "engine died", "type": "InternalServerError", "code": code}}
    respx.post(COMPLETIONS).mock(
        return_value=httpx.Response(200, content=_sse(_chunk([7]), error, "[DONE]"))
    )
    got: list[TokenDelta] = []
    stream = adapter.generate(_req())
    got.append(await anext(stream))
    with pytest.raises(EngineError, match="engine died") as err:
        await anext(stream)
    assert err.value.retryable is retryable
    assert got[0].token_ids == [7]


@respx.mock
async def test_a_stream_cut_short_is_a_retryable_error(adapter: VLLMAdapter) -> None:
    respx.post(COMPLETIONS).mock(return_value=httpx.Response(200, content=_sse(_chunk([7]))))
    with pytest.raises(EngineError, match="without a finish_reason") as err:
        await _collect(adapter, _req())
    assert err.value.retryable


async def test_out_of_vocabulary_tokens_are_refused_before_sending(
    client: httpx.AsyncClient,
) -> None:
    adapter = VLLMAdapter("v0", BASE, client=client, vocab_size=10)
    with respx.mock(assert_all_called=False) as mock:
        route = mock.post(COMPLETIONS)
        with pytest.raises(EngineError, match="out of vocabulary") as err:
            await _collect(adapter, _req([1, 10]))
        assert not route.called
    assert not err.value.retryable


class _Endless(httpx.AsyncByteStream):
    """One SSE chunk, then nothing until closed: a generation that is still running."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield _sse(_chunk([7]))
        await self.closed.wait()

    async def aclose(self) -> None:
        self.closed.set()


@respx.mock
async def test_abort_closes_the_stream_and_ends_with_an_abort_delta(adapter: VLLMAdapter) -> None:
    body = _Endless()
    respx.post(COMPLETIONS).mock(return_value=httpx.Response(200, stream=body))
    stream = adapter.generate(_req())
    first = await anext(stream)
    await adapter.abort("r1")
    rest = [d async for d in stream]
    assert first.token_ids == [7]
    assert [(d.finished, d.finish_reason) for d in rest] == [(True, "abort")]
    assert body.closed.is_set()


VLLM_METRICS_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 2400.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1152.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="1820"} 1.0
"""


@respx.mock
async def test_load_comes_from_metrics(adapter: VLLMAdapter) -> None:
    respx.get(f"{BASE}/metrics").mock(return_value=httpx.Response(200, text=VLLM_METRICS_TEXT))
    load = await adapter.load()
    assert (load.running, load.waiting, load.kv_usage) == (2, 1, 0.25)
    assert (load.prefix_cache_queries, load.prefix_cache_hits) == (2400.0, 1152.0)
    assert (load.block_size, load.num_blocks) == (128, 1820)


def test_metrics_of_several_engines_are_summed_and_usage_averaged() -> None:
    text = VLLM_METRICS_TEXT + (
        'vllm:num_requests_running{engine="1",model_name="m"} 3.0\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75\n'
    )
    load = parse_load(text)
    assert load.running == 5
    assert load.kv_usage == 0.5


@respx.mock
async def test_load_failures_are_engine_errors(adapter: VLLMAdapter) -> None:
    respx.get(f"{BASE}/metrics").mock(side_effect=httpx.ConnectError("down"))
    with pytest.raises(EngineError) as err:
        await adapter.load()
    assert err.value.retryable


@pytest.mark.parametrize(
    ("response", "healthy"),
    [(httpx.Response(200), True), (httpx.Response(503), False), (httpx.ConnectError("x"), False)],
)
@respx.mock
async def test_health(
    adapter: VLLMAdapter, response: httpx.Response | Exception, healthy: bool
) -> None:
    route = respx.get(f"{BASE}/health")
    if isinstance(response, Exception):
        route.mock(side_effect=response)
    else:
        route.mock(return_value=response)
    assert await adapter.health() is healthy


async def test_kv_events_need_an_endpoint(adapter: VLLMAdapter) -> None:
    with pytest.raises(EngineError, match="no KV-event endpoint") as err:
        await anext(adapter.kv_events())
    assert err.value.cause == "instance"  # the instance's configuration, not a request


@respx.mock
async def test_the_routers_own_connections_all_in_use_is_not_the_engines_fault(
    adapter: VLLMAdapter,
) -> None:
    """A pool timeout is the router out of connections, not the engine failing: counting
    it against the engine would open the breakers of healthy engines under load."""
    respx.post(COMPLETIONS).mock(side_effect=httpx.PoolTimeout("all busy"))
    with pytest.raises(EngineError) as busy:
        await _collect(adapter, _req())
    assert (busy.value.cause, busy.value.held_against_instance) == ("busy", False)
    assert "connections to engines are all in use" in str(busy.value)

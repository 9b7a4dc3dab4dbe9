"""The vLLM adapter's log probabilities and structured output: what it asks of vLLM and
how it reads the answer (token IDs as ``token_id:N``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import respx

from engines_adapter.contract import EngineError, GenerateRequest, StructuredOutput
from engines_adapter.vllm import VLLMAdapter

BASE = "http://vllm.test:8000"
COMPLETIONS = f"{BASE}/v1/completions"


def _chunk(ids: list[int], logprobs: dict[str, Any] | None, finish: str | None = None) -> str:
    choice = {"index": 0, "text": "", "token_ids": ids, "finish_reason": finish,
              "logprobs": logprobs}  # fmt: skip
    return f"data: {json.dumps({'id': 'c', 'choices': [choice]})}\n\n"


def _lp(pairs: list[tuple[int, float]], tops: list[dict[int, float]]) -> dict[str, Any]:
    return {"tokens": [f"token_id:{t}" for t, _ in pairs],
            "token_logprobs": [v for _, v in pairs],
            "top_logprobs": [{f"token_id:{t}": v for t, v in top.items()} for top in tops],
            "text_offset": [0] * len(pairs)}  # fmt: skip


@pytest.fixture
async def adapter() -> AsyncIterator[VLLMAdapter]:
    async with httpx.AsyncClient() as client:
        yield VLLMAdapter("v0", BASE, client=client, model="m")


def _mock(*chunks: str) -> respx.Route:
    content = ("".join(chunks) + "data: [DONE]\n\n").encode()
    headers = {"content-type": "text/event-stream"}
    response = httpx.Response(200, content=content, headers=headers)
    return respx.post(COMPLETIONS).mock(return_value=response)


@respx.mock
async def test_logprobs_are_asked_as_token_ids_and_read_per_token(adapter: VLLMAdapter) -> None:
    route = _mock(
        _chunk([7], _lp([(7, -0.5)], [{7: -0.5, 9: -1.5}])),
        _chunk([8], _lp([(8, -0.25)], [{3: -2.0, 8: -0.25}]), "length"),
    )
    request = GenerateRequest(request_id="r", prompt_token_ids=[1, 2], max_tokens=2, logprobs=2)
    deltas = [d async for d in adapter.generate(request)]
    body = json.loads(route.calls.last.request.content)
    assert body["logprobs"] == 2
    assert body["return_tokens_as_token_ids"] is True
    entries = [e for d in deltas for e in d.logprobs or []]
    assert [(e.token_id, e.logprob) for e in entries] == [(7, -0.5), (8, -0.25)]
    assert [e.top for e in entries] == [[(7, -0.5), (9, -1.5)], [(8, -0.25), (3, -2.0)]]


@respx.mock
async def test_logprobs_for_other_tokens_than_the_chunks_are_the_engines_fault(
    adapter: VLLMAdapter,
) -> None:
    _mock(_chunk([7, 8], _lp([(7, -0.5)], [{}]), "length"))
    request = GenerateRequest(request_id="r", prompt_token_ids=[1], max_tokens=2, logprobs=0)
    with pytest.raises(EngineError) as caught:
        _ = [d async for d in adapter.generate(request)]
    assert caught.value.cause == "instance"


@pytest.mark.parametrize(
    ("structured", "expected"),
    [(StructuredOutput(), {"type": "json_object"}),
     (StructuredOutput(json_schema={"type": "array"}),
      {"type": "json_schema", "json_schema": {"name": "output", "schema": {"type": "array"}}}),
     (None, None)],
)  # fmt: skip
@respx.mock
async def test_structured_output_goes_as_response_format(
    adapter: VLLMAdapter, structured: StructuredOutput | None, expected: dict[str, Any] | None
) -> None:
    route = _mock(_chunk([5], None, "stop"))
    request = GenerateRequest(request_id="r", prompt_token_ids=[1], max_tokens=1,
                              structured=structured)  # fmt: skip
    _ = [d async for d in adapter.generate(request)]
    body = json.loads(route.calls.last.request.content)
    assert body.get("response_format") == expected
    assert "logprobs" not in body

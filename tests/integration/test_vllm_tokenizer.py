"""The router's tokenizer against a real vLLM loading the same files: equal token IDs for
chats and plain prompts, and streamed text equal to vLLM's own detokenization."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from router.tokenization import builtin
from router.tokenization.detokenizer import IncrementalDetokenizer
from router.tokenization.engine import EngineTokenizer
from router.tokenization.hf import HFTokenizer
from vllm_launcher import Endpoint, random_model, vllm_python, vllm_servers

pytestmark = pytest.mark.vllm

CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hello, what is a prefix cache?"},
    {"role": "assistant", "content": "It keeps KV blocks."},
    {"role": "user", "content": [{"type": "text", "text": "Thanks! Café? 😀"},
                                 {"type": "text", "text": "second part"}]},
]  # fmt: skip


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    python = vllm_python()
    model = random_model(python, tmp_path_factory.mktemp("vllm-tok"), tokenizer=True)
    with vllm_servers(python, model, 1, skip_tokenizer_init=False) as (endpoint,):
        yield endpoint


@pytest.fixture(scope="module")
def tok() -> HFTokenizer:
    return HFTokenizer.from_pretrained(builtin.builtin_tokenizer_dir())


def _model(endpoint: Endpoint) -> str:
    return str(httpx.get(f"{endpoint.url}/v1/models").json()["data"][0]["id"])


def test_chat_and_text_token_ids_equal_vllms(engine: Endpoint, tok: HFTokenizer) -> None:
    model = _model(engine)
    body = {"model": model, "messages": CHAT, "add_generation_prompt": True}
    chat = httpx.post(f"{engine.url}/tokenize", json=body)
    assert chat.json()["tokens"] == tok.encode_chat(CHAT)
    for text in ("Hello world, the café 😀 prefill cache", "中文 and <|im_end|> inside"):
        answer = httpx.post(f"{engine.url}/tokenize", json={"model": model, "prompt": text})
        assert answer.json()["tokens"] == tok.encode_text(text)


def test_streamed_text_equals_vllms(engine: Endpoint, tok: HFTokenizer) -> None:
    body = {"model": _model(engine), "messages": CHAT, "max_tokens": 40, "temperature": 0,
            "return_token_ids": True}  # fmt: skip
    answer = httpx.post(f"{engine.url}/v1/chat/completions", json=body, timeout=120).json()
    prompt = tok.encode_chat(CHAT)
    assert answer["prompt_token_ids"] == prompt
    choice = answer["choices"][0]
    detok = IncrementalDetokenizer(tok, prompt)
    text = "".join(detok.push([i]) for i in choice["token_ids"]) + detok.flush()
    assert text == choice["message"]["content"]


async def test_engine_tokenizer_against_vllm(engine: Endpoint, tok: HFTokenizer) -> None:
    async with httpx.AsyncClient() as client:
        asking = EngineTokenizer(client, engine.url, model=_model(engine))
        assert await asking.encode_chat(CHAT) == tok.encode_chat(CHAT)
        assert await asking.encode_chat(CHAT) == tok.encode_chat(CHAT)
        assert asking.calls == 1
        assert asking.max_model_len == 4096


TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
]  # fmt: skip
TOOL_LOOP: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
]  # fmt: skip


def test_a_tools_request_tokenizes_as_vllms(engine: Endpoint, tok: HFTokenizer) -> None:
    """The tools rendered by the chat template, and a history holding a call (its
    arguments as JSON text) and its result: the router's prompt is vLLM's."""
    body = {"model": _model(engine), "messages": TOOL_LOOP, "tools": TOOLS,
            "add_generation_prompt": True}  # fmt: skip
    answer = httpx.post(f"{engine.url}/tokenize", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    router = tok.encode_chat(TOOL_LOOP, tools=TOOLS)
    assert '<tool_call>{"name": "get_weather"' in tok.decode(router)
    assert answer.json()["tokens"] == router

"""`pdd-router serve --demo` as a real process, driven by the official `openai` client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageFunctionToolCall
from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall
from process_support import free_port, spawn, terminate, wait_for

MODEL = "pdd-demo"
TURN_1: list[Any] = [
    {"role": "system", "content": "You are a helpful assistant that answers in one sentence."},
    {"role": "user", "content": "Hello, which pipeline will the router pick for this request?"},
]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OpenAI, Path]]:
    """The demo server on a free port, and a client of it; stopped by PID afterwards."""
    log = tmp_path_factory.mktemp("demo") / "serve.log"
    port = free_port()
    proc = spawn(["serve", "--demo", "--port", str(port), "--log-level", "warning"], log)
    try:
        wait_for(f"http://127.0.0.1:{port}/readyz", [(proc, log)], limit_s=20)
        client = OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=10, max_retries=0
        )
        yield client, log
        client.close()
    finally:
        terminate(proc)


def test_startup_line_names_the_base_url_and_model(demo: tuple[OpenAI, Path]) -> None:
    client, log = demo
    first = log.read_text().splitlines()[0]
    assert str(client.base_url).rstrip("/") in first
    assert MODEL in first


def test_models_list_names_the_demo_model(demo: tuple[OpenAI, Path]) -> None:
    client, _ = demo
    assert [m.id for m in client.models.list()] == [MODEL]


def test_chat_answers_and_the_second_turn_hits_the_cache(demo: tuple[OpenAI, Path]) -> None:
    client, _ = demo
    first = client.chat.completions.create(model=MODEL, messages=TURN_1)
    answer = first.choices[0].message.content
    assert answer
    assert answer.strip()
    assert answer.isascii()
    assert answer.isprintable()
    assert first.choices[0].finish_reason in ("stop", "length")
    assert first.usage is not None
    assert first.usage.prompt_tokens > 0
    assert first.usage.completion_tokens > 0

    turn_2 = [*TURN_1, {"role": "assistant", "content": answer},
              {"role": "user", "content": "Why that one?"}]  # fmt: skip
    second = client.chat.completions.create(model=MODEL, messages=turn_2)
    assert second.usage is not None
    assert second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached is not None
    assert 0 < cached <= second.usage.prompt_tokens


def test_streaming_chat_matches_the_whole_answer(demo: tuple[OpenAI, Path]) -> None:
    client, _ = demo
    messages = [*TURN_1[:1], {"role": "user", "content": "Tell me about prefix caches."}]
    whole = client.chat.completions.create(model=MODEL, messages=messages)
    stream = client.chat.completions.create(model=MODEL, messages=messages, stream=True)
    parts: list[str] = []
    reasons: list[str | None] = []
    for chunk in stream:
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            reasons.append(choice.finish_reason)
    text = "".join(parts)
    assert text  # the toy model is deterministic: the same prompt, the same answer
    assert text == whole.choices[0].message.content
    assert reasons[-1] == whole.choices[0].finish_reason
    assert all(r is None for r in reasons[:-1])


def test_text_completions_single_and_batched(demo: tuple[OpenAI, Path]) -> None:
    client, _ = demo
    one = client.completions.create(model=MODEL, prompt="Hello world", max_tokens=16)
    assert len(one.choices) == 1
    assert one.choices[0].text
    batch = client.completions.create(
        model=MODEL, prompt=["Hello world", "The engine decodes"], max_tokens=8
    )
    assert sorted(c.index for c in batch.choices) == [0, 1]


def test_refusals_in_openai_shape(demo: tuple[OpenAI, Path]) -> None:
    client, _ = demo
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=TURN_1, n=2)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=TURN_1)


def test_pipeline_header_on_non_streaming_responses(demo: tuple[OpenAI, Path]) -> None:
    client, _ = demo
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=TURN_1)
    assert raw.headers["x-pdd-pipeline"] in ("P-MD", "P-RLD", "P-RLD-MD")
    assert raw.parse().choices[0].message.content


WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}  # fmt: skip
ASK: Any = [{"role": "developer", "content": "Use the tools."},
       {"role": "user", "content": "What is the weather in Paris?"}]  # fmt: skip


def test_required_tool_choice_answers_with_a_call_then_the_result_gets_an_answer(
    demo: tuple[OpenAI, Path],
) -> None:
    client, _ = demo
    first = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER_TOOL], tool_choice="required"
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    # the call and its result go back in the history; the model answers in text
    history = [*ASK, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]  # fmt: skip
    second = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER_TOOL])
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second.choices[0].message.tool_calls is None
    assert second.choices[0].message.content
    assert second.usage is not None
    assert first.usage is not None
    assert second.usage.prompt_tokens > first.usage.prompt_tokens  # the call and result count


def test_a_named_tool_call_streams_its_name_then_argument_pieces(
    demo: tuple[OpenAI, Path],
) -> None:
    client, _ = demo
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    whole = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER_TOOL], tool_choice=named
    )
    (expected,) = whole.choices[0].message.tool_calls or []
    stream = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER_TOOL], tool_choice=named, stream=True
    )
    calls: list[tuple[ChoiceDeltaToolCall | None, str | None]] = []
    for chunk in stream:
        for choice in chunk.choices:
            deltas: list[ChoiceDeltaToolCall | None] = [*(choice.delta.tool_calls or [])]
            calls += [(c, choice.finish_reason) for c in deltas or [None]]
    pieces = [c for c, _ in calls if c is not None]
    assert calls[-1] == (None, "tool_calls")
    head = pieces[0]
    assert (head.index, head.type) == (0, "function")
    assert head.id
    assert head.function is not None
    assert (head.function.name, head.function.arguments) == ("get_weather", "")
    rest = pieces[1:]
    assert len(rest) > 1  # the arguments come in pieces
    assert all(p.id is None and p.function is not None and p.function.name is None for p in rest)
    arguments = "".join(p.function.arguments or "" for p in rest if p.function is not None)
    assert isinstance(expected, ChatCompletionMessageFunctionToolCall)
    assert json.loads(arguments) == json.loads(expected.function.arguments)


def test_logprobs_come_with_every_token(demo: tuple[OpenAI, Path]) -> None:
    client, _ = demo
    answer = client.chat.completions.create(
        model=MODEL, messages=TURN_1, logprobs=True, top_logprobs=3, max_tokens=8
    )
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.content is not None
    assert answer.usage is not None
    assert len(logprobs.content) == answer.usage.completion_tokens
    text = "".join(t.token for t in logprobs.content)
    assert text == answer.choices[0].message.content
    for token in logprobs.content:
        assert token.logprob < 0
        assert len(token.top_logprobs) == 3
        assert token.top_logprobs[0].token == token.token  # the demo picks the likeliest
        assert [t.logprob for t in token.top_logprobs] == sorted(
            (t.logprob for t in token.top_logprobs), reverse=True
        )


def test_json_object_response_format_answers_json(demo: tuple[OpenAI, Path]) -> None:
    client, _ = demo
    answer = client.chat.completions.create(
        model=MODEL, messages=TURN_1, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(answer.choices[0].message.content or ""), dict)
    schema: Any = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    shaped = client.chat.completions.create(
        model=MODEL, messages=TURN_1,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    )  # fmt: skip
    assert isinstance(json.loads(shaped.choices[0].message.content or "")["n"], int)


def test_echo_and_a_refused_field_by_name(demo: tuple[OpenAI, Path]) -> None:
    client, _ = demo
    echoed = client.completions.create(model=MODEL, prompt="The router", echo=True, max_tokens=4)
    assert echoed.choices[0].text.startswith("The router")
    assert len(echoed.choices[0].text) > len("The router")
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=TURN_1, store=True)
    assert refused.value.body["param"] == "store"  # type: ignore[index]

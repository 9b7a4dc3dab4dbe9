"""Each tool-call format parsed whole, and streamed split at every point: the streamed
deltas add up to the whole answer's message."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.tool_calls.formats import (
    FORMATS,
    JsonArray,
    ToolCallFormat,
    detect_format,
    format_named,
)
from router.tool_calls.reasoning import ReasoningFormat
from router.tool_calls.stream import AnswerParser, Message

B = "\uff5c"  # DeepSeek's special tokens sit between full-width bars
WEATHER = {"city": "Paris", "unit": "c", "days": [1, 2], "note": 'a "quoted" } brace'}
TIME = {"zone": "UTC"}


def _args(value: dict[str, Any]) -> str:
    return json.dumps(value)


CASES: list[tuple[str, ToolCallFormat, str, str | None, list[tuple[str, dict[str, Any]]]]] = [
    ("hermes", FORMATS["hermes"],
     f'Let me check. <tool_call>\n{{"name": "weather", "arguments": {_args(WEATHER)}}}\n'
     f'</tool_call>\n<tool_call>\n{{"name": "time", "arguments": {_args(TIME)}}}\n</tool_call>',
     "Let me check. ", [("weather", WEATHER), ("time", TIME)]),
    ("llama3_json", FORMATS["llama3_json"],
     f'<|python_tag|>{{"name": "weather", "parameters": {_args(WEATHER)}}}; '
     f'{{"name": "time", "parameters": {_args(TIME)}}}',
     None, [("weather", WEATHER), ("time", TIME)]),
    ("mistral", FORMATS["mistral"],
     f'[TOOL_CALLS][{{"name": "weather", "arguments": {_args(WEATHER)}}}, '
     f'{{"name": "time", "arguments": {_args(TIME)}}}]',
     None, [("weather", WEATHER), ("time", TIME)]),
    ("mistral_v11", FORMATS["mistral"],
     f"[TOOL_CALLS]weather[ARGS]{_args(WEATHER)}[TOOL_CALLS]time[ARGS]{_args(TIME)}",
     None, [("weather", WEATHER), ("time", TIME)]),
    ("deepseek_v3", FORMATS["deepseek_v3"],
     f"Checking.<{B}tool▁calls▁begin{B}><{B}tool▁call▁begin{B}>function<{B}tool▁sep{B}>weather\n"
     f"```json\n{_args(WEATHER)}\n```<{B}tool▁call▁end{B}><{B}tool▁call▁begin{B}>function"
     f"<{B}tool▁sep{B}>time\n```json\n{_args(TIME)}\n```<{B}tool▁call▁end{B}><{B}tool▁calls▁end{B}>",
     "Checking.", [("weather", WEATHER), ("time", TIME)]),
    ("deepseek_v31", FORMATS["deepseek_v3"],
     f"<{B}tool▁calls▁begin{B}><{B}tool▁call▁begin{B}>weather<{B}tool▁sep{B}>{_args(WEATHER)}"
     f"<{B}tool▁call▁end{B}><{B}tool▁calls▁end{B}>",
     None, [("weather", WEATHER)]),
    ("required", JsonArray(),
     f'[{{"name": "weather", "parameters": {_args(WEATHER)}}}]', None, [("weather", WEATHER)]),
    ("named", format_named("weather"), _args(WEATHER), None, [("weather", WEATHER)]),
]  # fmt: skip


def _parser(form: ToolCallFormat | None, reasoning: ReasoningFormat | None = None) -> AnswerParser:
    return AnswerParser(form, reasoning, lambda i: f"call_{i}")


def _streamed(parser: AnswerParser, pieces: list[str]) -> Message:
    """The message the streamed deltas add up to, checking OpenAI's chunk shape."""
    content, reasoning = "", ""
    calls: list[dict[str, Any]] = []
    deltas = [d for piece in pieces for d in parser.push(piece)] + parser.finish()
    for delta in deltas:
        content += delta.get("content", "")
        reasoning += delta.get("reasoning_content", "")
        for call in delta.get("tool_calls", []):
            if call["index"] == len(calls):  # the first delta of a call names it
                assert call["id"]
                assert call["type"] == "function"
                assert call["function"] == {"name": call["function"]["name"], "arguments": ""}
                calls.append(
                    {
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": ""},
                    }
                )
            else:
                assert set(call) == {"index", "function"}
                assert set(call["function"]) == {"arguments"}
                calls[call["index"]]["function"]["arguments"] += call["function"]["arguments"]
    return Message(content if content.strip() or not calls else None, reasoning or None, calls)


@pytest.mark.parametrize(("name", "form", "text", "content", "expected"), CASES,
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_whole_answer_gives_the_calls(
    name: str, form: ToolCallFormat, text: str, content: str | None,
    expected: list[tuple[str, dict[str, Any]]],
) -> None:  # fmt: skip
    message = _parser(form).message(text)
    assert message.content == content
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
           for c in message.tool_calls]  # fmt: skip
    assert got == expected
    assert [c["id"] for c in message.tool_calls] == [f"call_{i}" for i in range(len(expected))]


@pytest.mark.parametrize(("name", "form", "text", "content", "expected"), CASES,
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_streamed_at_every_split_point_adds_up_to_the_whole(
    name: str, form: ToolCallFormat, text: str, content: str | None,
    expected: list[tuple[str, dict[str, Any]]],
) -> None:  # fmt: skip
    whole = _parser(form).message(text)
    for cut in range(len(text) + 1):
        parser = _parser(form)
        assert _streamed(parser, [text[:cut], text[cut:]]) == whole, cut
        assert parser.called
    assert _streamed(_parser(form), list(text)) == whole


@pytest.mark.parametrize("form", list(FORMATS.values()), ids=list(FORMATS))
def test_plain_text_stays_content(form: ToolCallFormat) -> None:
    text = "The weather in Paris is mild; take a coat [maybe] {or not}."
    parser = _parser(form)
    assert parser.message(text) == Message(text)
    assert not parser.called
    for cut in range(len(text) + 1):
        assert _streamed(_parser(form), [text[:cut], text[cut:]]) == Message(text)


@pytest.mark.parametrize(
    "text",
    ['<tool_call>\n{"name": "weather", "arguments": {"city": "Par',
     '<tool_call>\n{"nome": "weather"}</tool_call>',
     '<tool_call>\n{"name": "weather", "arguments": [1, 2]}</tool_call>'],
)  # fmt: skip
def test_a_cut_or_invalid_call_is_content(text: str) -> None:
    assert _parser(FORMATS["hermes"]).message(text) == Message(text)


def test_llama_json_that_is_no_call_stays_content() -> None:
    text = '{"answer": 42}'
    assert _parser(FORMATS["llama3_json"]).message(text) == Message(text)
    assert _streamed(_parser(FORMATS["llama3_json"]), list(text)) == Message(text)


@pytest.mark.parametrize(
    ("form", "text", "reasoning", "content"),
    [("qwen3", "<think>\nweigh it</think>\n\nIt is 4.", "\nweigh it", "It is 4."),
     ("qwen3", "It is 4.", None, "It is 4."),
     ("deepseek_r1", "weigh it</think>It is 4.", "weigh it", "It is 4."),
     ("deepseek_r1", "still weighing", "still weighing", None)],
)  # fmt: skip
def test_reasoning_goes_to_reasoning_content(
    form: ReasoningFormat, text: str, reasoning: str | None, content: str | None
) -> None:
    whole = _parser(None, form).message(text)
    assert (whole.reasoning, whole.content or None) == (reasoning, content)
    for cut in range(len(text) + 1):
        streamed = _streamed(_parser(None, form), [text[:cut], text[cut:]])
        assert (streamed.reasoning, streamed.content or None) == (reasoning, content), cut


def test_reasoning_then_a_tool_call() -> None:
    text = '<think>need the weather</think>\n<tool_call>{"name": "w", "arguments": {}}</tool_call>'
    message = _parser(FORMATS["hermes"], "qwen3").message(text)
    assert message.reasoning == "need the weather"
    assert message.content is None
    assert [c["function"] for c in message.tool_calls] == [{"name": "w", "arguments": "{}"}]


def test_parallel_tool_calls_false_keeps_the_first() -> None:
    text = CASES[0][2]
    parser = AnswerParser(FORMATS["hermes"], None, lambda i: f"c{i}", parallel=False)
    assert [c["function"]["name"] for c in parser.message(text).tool_calls] == ["weather"]


@pytest.mark.parametrize(
    ("template", "name"),
    [("{% for m in messages %}<tool_call>{{ m }}</tool_call>{% endfor %}", "hermes"),
     ("[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]", "mistral"),
     (f"<{B}tool▁calls▁begin{B}>{{ x }}", "deepseek_v3"),
     ("<|start_header_id|>ipython<|end_header_id|>{{ '<|python_tag|>' }}", "llama3_json"),
     ("{{ messages }}", None), (None, None)],
)  # fmt: skip
def test_format_detected_from_the_chat_template(template: str | None, name: str | None) -> None:
    assert detect_format(template) == name

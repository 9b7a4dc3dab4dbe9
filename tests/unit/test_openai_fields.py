"""Every field of OpenAI's chat and completion request bodies, taken from the installed
``openai`` package, is honoured, passed on, or refused naming it: none is accepted and
dropped. A field OpenAI adds fails here until the router says what it does with it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from openai.types import completion_create_params as completion_params
from openai.types.chat import completion_create_params as chat_params
from pydantic import ValidationError

from router.service.engine_fields import CLIENT_ENGINE_FIELDS
from router.service.openai_fields import CHAT_FIELDS, COMPLETION_FIELDS
from router.service.schemas import ChatRequest, CompletionRequest, GenerationFields

DOC = Path(__file__).resolve().parents[2] / "docs" / "openai-fields.md"
MESSAGES = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def _fields(module: Any) -> set[str]:
    names: set[str] = set()
    for typed in (
        module.CompletionCreateParamsNonStreaming,
        module.CompletionCreateParamsStreaming,
    ):
        for klass in typed.__mro__:
            names |= set(getattr(klass, "__annotations__", {}))
    return names


CHAT = _fields(chat_params)
COMPLETION = _fields(completion_params)

ACCEPTED: dict[str, Any] = {
    "messages": MESSAGES, "prompt": "hi", "model": "m", "max_tokens": 4,
    "max_completion_tokens": 4, "temperature": 0.5, "top_p": 0.9, "n": 1, "best_of": 1,
    "stop": ["x"], "stream": True, "stream_options": {"include_usage": True}, "seed": 7,
    "user": "u", "safety_identifier": "s", "prompt_cache_key": "k", "frequency_penalty": 0.1,
    "presence_penalty": 0.1, "logit_bias": {"5": 1.0}, "logprobs": True, "top_logprobs": 2,
    "response_format": {"type": "json_object"}, "tools": [TOOL], "tool_choice": "auto",
    "parallel_tool_calls": False, "reasoning_effort": "low", "store": False, "metadata": None,
    "service_tier": "auto", "modalities": ["text"], "audio": None, "prediction": None,
    "functions": None, "function_call": None, "moderation": None, "verbosity": None,
    "web_search_options": None, "prompt_cache_options": None, "prompt_cache_retention": None,
    "echo": True, "suffix": None,
}  # fmt: skip
"""A value of each field the router serves."""

REFUSED: dict[str, Any] = {
    "n": 2, "best_of": 3, "store": True, "metadata": {"a": "b"}, "service_tier": "flex",
    "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "mp3"},
    "prediction": {"type": "content", "content": "x"},
    "functions": [{"name": "f", "parameters": {}}], "function_call": "auto",
    "moderation": {"model": "x"}, "verbosity": "low", "web_search_options": {},
    "prompt_cache_options": {"a": 1}, "prompt_cache_retention": "24h", "suffix": "end",
}  # fmt: skip
"""A value of each field the router refuses at some values."""


def _body(kind: type[GenerationFields], **fields: Any) -> dict[str, Any]:
    base = {"messages": MESSAGES} if kind is ChatRequest else {"prompt": "hi"}
    return {**base, **fields}


def _completion_value(name: str) -> Any:
    return 2 if name == "logprobs" else ACCEPTED[name]


@pytest.mark.parametrize(
    ("kind", "fields", "table"),
    [(ChatRequest, CHAT, CHAT_FIELDS), (CompletionRequest, COMPLETION, COMPLETION_FIELDS)],
    ids=["chat", "completions"],
)  # fmt: skip
def test_every_openai_field_is_in_the_table_and_the_doc(
    kind: type[GenerationFields], fields: set[str], table: dict[str, str]
) -> None:
    assert fields, "the openai package's request fields were not found"
    assert fields - set(table) == set(), "fields the router does not say what it does with"
    documented = set(re.findall(r"^\| `(\w+)` \|", DOC.read_text(), re.MULTILINE))
    assert fields - documented == set(), "fields missing from docs/openai-fields.md"


@pytest.mark.parametrize("name", sorted(CHAT))
def test_each_chat_field_is_served_or_refused_by_name(name: str) -> None:
    needs = {"logprobs": True} if name == "top_logprobs" else {}
    accepted = ChatRequest.model_validate(_body(ChatRequest, **{name: ACCEPTED[name]}, **needs))
    _kept(accepted, name)
    if name in REFUSED:
        with pytest.raises(ValidationError) as caught:
            ChatRequest.model_validate(_body(ChatRequest, **{name: REFUSED[name]}))
        assert _param(caught.value) == name


@pytest.mark.parametrize("name", sorted(COMPLETION))
def test_each_completion_field_is_served_or_refused_by_name(name: str) -> None:
    value = _completion_value(name)
    extra = {"echo": False} if name == "logprobs" else {}
    accepted = CompletionRequest.model_validate(_body(CompletionRequest, **{name: value}, **extra))
    _kept(accepted, name)
    if name in REFUSED:
        with pytest.raises(ValidationError) as caught:
            CompletionRequest.model_validate(_body(CompletionRequest, **{name: REFUSED[name]}))
        assert _param(caught.value) == name


def _kept(request: GenerationFields, name: str) -> None:
    """An accepted field is one the request model reads, or passes on to the engines, or
    one accepted only at values that ask for what the router does anyway."""
    declared = name in type(request).model_fields
    passed = name in request.passed_through() and name in CLIENT_ENGINE_FIELDS
    as_is = name in type(request).REFUSED_AT_SOME_VALUES
    assert declared or passed or as_is, f"{name} accepted but neither read nor passed on"


def _param(error: ValidationError) -> str | None:
    first = error.errors()[0]
    ctx = first.get("ctx") or {}
    loc = [str(p) for p in first["loc"]]
    return ctx.get("param") or (loc[0] if loc else None)


def test_a_field_openai_does_not_have_is_refused_by_name() -> None:
    with pytest.raises(ValidationError) as caught:
        ChatRequest.model_validate(_body(ChatRequest, made_up_field=1))
    assert _param(caught.value) == "made_up_field"


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"top_logprobs": 2}, "top_logprobs"),
     ({"tool_choice": "required"}, "tool_choice"),
     ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
      "tool_choice"),
     ({"tools": [{"type": "function", "function": {}}]}, "tools"),
     ({"response_format": {"type": "json_schema"}}, "response_format")],
)  # fmt: skip
def test_incoherent_chat_options_are_refused_by_name(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ChatRequest.model_validate(_body(ChatRequest, **fields))
    assert _param(caught.value) == param


def test_echo_with_logprobs_is_refused_naming_echo() -> None:
    with pytest.raises(ValidationError) as caught:
        CompletionRequest.model_validate(_body(CompletionRequest, echo=True, logprobs=1))
    assert _param(caught.value) == "echo"

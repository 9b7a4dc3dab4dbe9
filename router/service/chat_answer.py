"""How a chat request's answer is read and constrained: the tool-call format its model
writes (its settings, else its chat template's markers), its reasoning format, and the
structured output that ``response_format`` or an enforced ``tool_choice`` asks of the
engines (a JSON schema for the calls, as vLLM builds one for ``required``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engines_adapter.contract import StructuredOutput
from router.service.chat_options import NamedToolChoice
from router.service.errors import ApiError
from router.service.models import ResolvedModel
from router.service.schemas import ChatRequest
from router.tokenization.protocol import AsyncTokenizerLike
from router.tool_calls.formats import (
    FORMATS,
    JsonArray,
    ToolCallFormat,
    detect_format,
    format_named,
)
from router.tool_calls.reasoning import ReasoningFormat
from router.tool_calls.stream import AnswerParser

__all__ = ["AnswerPlan", "answer_plan", "call_ids"]


@dataclass(frozen=True, slots=True)
class AnswerPlan:
    """What reads the answer (``tools``: the call format, None: no calls parsed) and what
    constrains it."""

    tools: ToolCallFormat | None
    reasoning: ReasoningFormat | None
    structured: StructuredOutput | None
    parallel: bool

    def parser(self) -> AnswerParser:
        return AnswerParser(self.tools, self.reasoning, call_ids(), parallel=self.parallel)


def call_ids() -> Callable[[int], str]:
    """Ids for an answer's calls, one per index, as OpenAI writes them (``call_...``)."""
    given: dict[int, str] = {}
    return lambda index: given.setdefault(index, f"call_{uuid.uuid4().hex[:24]}")


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    params = (tool.get("function") or {}).get("parameters")
    return params if isinstance(params, dict) and params else {"type": "object"}


def _required_schema(tools: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """An array of ``{"name", "parameters"}`` calls, each of one of the tools."""
    calls = [
        {"type": "object", "required": ["name", "parameters"],
         "properties": {"name": {"type": "string", "const": (t.get("function") or {})["name"]},
                        "parameters": _parameters(t)}}
        for t in tools
    ]  # fmt: skip
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def _model_format(model: ResolvedModel, tokenizer: AsyncTokenizerLike) -> ToolCallFormat:
    settings = model.settings
    name = settings.tool_call_format if settings is not None else None
    if name is None:
        source = getattr(getattr(tokenizer, "tokenizer", None), "template_source", None)
        name = detect_format(source() if callable(source) else None)
    if name is None:
        raise ApiError(
            400, f"tools: model {model.name!r} has no tool-call format set (models[]."
            "tool_call_format) and its chat template shows none the router reads",
            param="tools",
        )  # fmt: skip
    return FORMATS[name]


def _response_format(body: ChatRequest) -> StructuredOutput | None:
    given = body.response_format
    if given is None or given.type == "text":
        return None
    if given.type == "json_object":
        return StructuredOutput()
    assert given.json_schema is not None  # the model's validator ensures it
    return StructuredOutput(json_schema=given.json_schema.schema_ or {"type": "object"})


def answer_plan(
    body: ChatRequest, model: ResolvedModel, tokenizer: AsyncTokenizerLike
) -> AnswerPlan:
    """The plan of a chat request's answer (ApiError 400 naming the field it cannot honour)."""
    reasoning = model.settings.reasoning_format if model.settings is not None else None
    structured = _response_format(body)
    choice = body.tool_choice
    tools: ToolCallFormat | None = None
    if body.tools and choice != "none":
        enforced: StructuredOutput | None = None
        if isinstance(choice, NamedToolChoice):
            name = choice.function.name
            named = next(t for t in body.tools if (t.get("function") or {}).get("name") == name)
            tools = format_named(name)
            enforced = StructuredOutput(json_schema=_parameters(named))
        elif choice == "required":
            schema = _required_schema(body.tools, body.parallel_tool_calls)
            tools, enforced = JsonArray(), StructuredOutput(json_schema=schema)
        else:
            tools = _model_format(model, tokenizer)
        if enforced is not None:
            if structured is not None:
                raise ApiError(400, "response_format cannot constrain an answer that "
                               "tool_choice already constrains to a call",
                               param="response_format")  # fmt: skip
            structured = enforced
            reasoning = None  # the constrained answer is the call alone
    return AnswerPlan(tools, reasoning, structured, body.parallel_tool_calls)

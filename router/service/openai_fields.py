"""What the router does with every field of OpenAI's chat and completion request bodies:
each is honoured by the router, passed on to the engines, or refused (400 naming it) when
set to a value the router cannot honour. docs/openai-fields.md is this table for readers;
a test walks the fields of the installed ``openai`` package against it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CHAT_FIELDS", "COMPLETION_FIELDS", "Refusal", "refusal_of"]

CHAT_FIELDS: Mapping[str, str] = {
    "messages": "honoured: rendered with the model's chat template (developer as system)",
    "model": "honoured: the model whose instances serve the request",
    "max_tokens": "honoured",
    "max_completion_tokens": "honoured (over max_tokens)",
    "temperature": "honoured: passed on",
    "top_p": "passed on",
    "n": "honoured when 1; other values refused",
    "stop": "honoured by the router on the decoded text",
    "stream": "honoured",
    "stream_options": "honoured (include_usage)",
    "seed": "passed on",
    "user": "honoured: the session id when no session_id is given",
    "safety_identifier": "honoured as user",
    "prompt_cache_key": "honoured: the session id when no session_id or user is given",
    "frequency_penalty": "passed on",
    "presence_penalty": "passed on",
    "logit_bias": "passed on",
    "logprobs": "honoured: asked of the engines, joined across a handoff",
    "top_logprobs": "honoured, with logprobs",
    "response_format": "honoured: structured output on engines that offer it, else refused",
    "tools": "honoured: rendered by the chat template; calls parsed from the answer",
    "tool_choice": "honoured: none, auto; required and a named function through structured output",
    "parallel_tool_calls": "honoured: false keeps the first call (one call when enforced)",
    "reasoning_effort": "honoured: handed to the chat template (reasoning_effort)",
    "store": "honoured when false (nothing is stored); true refused",
    "metadata": "refused: no completion is stored to attach it to",
    "service_tier": "honoured when auto or default; other tiers refused",
    "modalities": "honoured when text only; audio refused",
    "audio": "refused: the models write text",
    "prediction": "refused: predicted outputs are not supported",
    "functions": "refused: the deprecated functions API (send tools)",
    "function_call": "refused: the deprecated functions API (send tool_choice)",
    "moderation": "refused: no moderation runs here",
    "verbosity": "refused: no verbosity setting reaches the models",
    "web_search_options": "refused: no web search runs here",
    "prompt_cache_options": "refused: the engines' prefix caches keep what memory allows",
    "prompt_cache_retention": "refused: the engines' prefix caches keep what memory allows",
}
"""Every chat completion field, and what the router does with it."""

COMPLETION_FIELDS: Mapping[str, str] = {
    "prompt": "honoured: text, texts, token IDs or lists of token IDs",
    "model": "honoured: the model whose instances serve the request",
    "max_tokens": "honoured",
    "temperature": "honoured: passed on",
    "top_p": "passed on",
    "n": "honoured when 1; other values refused",
    "best_of": "honoured when 1; other values refused",
    "stop": "honoured by the router on the decoded text",
    "stream": "honoured",
    "stream_options": "honoured (include_usage)",
    "seed": "passed on",
    "user": "honoured: the session id when no session_id is given",
    "frequency_penalty": "passed on",
    "presence_penalty": "passed on",
    "logit_bias": "passed on",
    "logprobs": "honoured: asked of the engines, joined across a handoff",
    "echo": "honoured: the prompt's text leads the answer (refused with logprobs)",
    "suffix": "refused: no insertion (fill-in-the-middle) is offered",
}
"""Every completion field, and what the router does with it."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A field accepted only at values the router honours anyway (``accepts``)."""

    accepts: Callable[[Any], bool]
    why: str


def _none(value: Any) -> bool:
    return value is None


def _none_or(*allowed: Any) -> Callable[[Any], bool]:
    return lambda value: value is None or any(value == a for a in allowed)


_REFUSED: Mapping[str, Refusal] = {
    "store": Refusal(_none_or(False), "the router stores no completions"),
    "metadata": Refusal(_none_or({}), "the router stores no completions to attach it to"),
    "service_tier": Refusal(_none_or("auto", "default"), "one service tier is served: auto"),
    "modalities": Refusal(_none_or(["text"]), "the models write text only"),
    "audio": Refusal(_none, "the models write text, not audio"),
    "prediction": Refusal(_none, "predicted outputs are not supported"),
    "functions": Refusal(_none, "the deprecated functions API is not served: send tools"),
    "function_call": Refusal(_none, "the deprecated functions API is not served: send tool_choice"),
    "moderation": Refusal(_none, "no moderation runs here"),
    "verbosity": Refusal(_none, "no verbosity setting reaches the models"),
    "web_search_options": Refusal(_none, "no web search runs here"),
    "prompt_cache_options": Refusal(
        _none, "the engines' prefix caches keep what their memory allows"
    ),
    "prompt_cache_retention": Refusal(
        _none, "the engines' prefix caches keep what their memory allows"
    ),
    "best_of": Refusal(_none_or(1), "only best_of=1 is supported"),
    "suffix": Refusal(_none, "no insertion (fill-in-the-middle) is offered"),
}


def refusal_of(name: str, value: Any) -> str | None:
    """Why ``name`` at ``value`` is refused (None: the field is not one of those refused
    at some values, or the value is one the router honours)."""
    refusal = _REFUSED.get(name)
    if refusal is None or refusal.accepts(value):
        return None
    return refusal.why

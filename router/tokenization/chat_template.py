"""Chat templates rendered as transformers' ``apply_chat_template`` renders them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, NoReturn

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = [
    "ChatTemplate",
    "ChatTemplateError",
    "ContentFormat",
    "Message",
    "normalize_messages",
    "select_template",
]

Message = Mapping[str, Any]
ContentFormat = Literal["string", "openai"]


class ChatTemplateError(ValueError):
    """A template that does not compile, a missing template, or ``raise_exception``."""


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(message)


def _tojson(
    x: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' ``tojson``: unlike jinja2's own, it does not escape HTML characters."""
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask tag): the
    body renders as it is."""

    tags = {"generation"}  # noqa: RUF012 - jinja2's extension API

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class _BudgetedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox with ``*`` and ``**`` checked before they run, so that a short template
    cannot build millions of characters (or digits) in one step, beyond any check between
    steps: ``{{ 'ab ' * 2000000 }}`` is refused, not rendered."""

    intercepted_binops = frozenset({"*", "**"})

    def __init__(self, max_chars: int, **options: Any) -> None:
        super().__init__(**options)
        self.max_chars = max_chars

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            _check_repeat(left, right, self.max_chars)
        elif operator == "**" and isinstance(left, int) and isinstance(right, int):
            digits = max(abs(left), 2).bit_length() * abs(right) // 3
            if digits > self.max_chars:
                raise ChatTemplateError(f"chat template: {left} ** {right} is over the budget "
                                        f"of {self.max_chars} characters")  # fmt: skip
        return super().call_binop(context, operator, left, right)


def _check_repeat(left: Any, right: Any, max_chars: int) -> None:
    """``sequence * n`` (either way round) within ``max_chars`` items."""
    for seq, times in ((left, right), (right, left)):
        if isinstance(seq, str | list | tuple) and isinstance(times, int):
            size = len(seq) * times
            if size > max_chars:
                raise ChatTemplateError(
                    f"chat template: repeating {len(seq)} items {times} times is over the "
                    f"budget of {max_chars} characters"
                )


def _environment(max_chars: int | None = None) -> ImmutableSandboxedEnvironment:
    options: dict[str, Any] = {
        "trim_blocks": True,
        "lstrip_blocks": True,
        "extensions": [_GenerationTag, jinja2.ext.loopcontrols],
    }
    env = (
        ImmutableSandboxedEnvironment(**options)
        if max_chars is None
        else _BudgetedEnvironment(max_chars, **options)
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def select_template(
    templates: str | Mapping[str, str] | None, name: str | None = None, *, has_tools: bool = False
) -> str:
    """The template to render, chosen as transformers does: a named template when asked
    for (or a literal template when ``name`` holds jinja), else ``tool_use`` when tools
    are given and it exists, else ``default``."""
    if name is not None and ("{{" in name or "{%" in name):
        return name
    if isinstance(templates, str):
        if name is not None and name != "default":
            raise ChatTemplateError(f"no chat template named {name!r}; there is only one")
        return templates
    if not templates:
        raise ChatTemplateError("the tokenizer has no chat template")
    if name is not None:
        if name not in templates:
            raise ChatTemplateError(f"no chat template named {name!r}: {sorted(templates)}")
        return templates[name]
    if has_tools and "tool_use" in templates:
        return templates["tool_use"]
    if "default" in templates:
        return templates["default"]
    raise ChatTemplateError(f"no default chat template among {sorted(templates)}")


def _text_of(content: Sequence[Any], role: str) -> str:
    parts: list[str] = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, Mapping) and part.get("type") == "text":
            parts.append(str(part.get("text", "")))
        else:
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise ChatTemplateError(f"{role} message: content part {kind!r} is not text")
    return "\n".join(parts)


def normalize_messages(
    messages: Sequence[Message], content_format: ContentFormat = "string"
) -> list[dict[str, Any]]:
    """OpenAI messages as vLLM hands them to a template: with the ``string`` content
    format, text parts joined by newlines; tool-call arguments given as JSON text
    parsed into objects."""
    out: list[dict[str, Any]] = []
    for message in messages:
        item = dict(message)
        role = str(item.get("role", ""))
        content = item.get("content")
        if content_format == "string" and isinstance(content, list):
            item["content"] = _text_of(content, role)
        calls = item.get("tool_calls")
        if isinstance(calls, list):
            item["tool_calls"] = [_parsed_call(call) for call in calls]
        out.append(item)
    return out


def _parsed_call(call: Any) -> Any:
    if not isinstance(call, Mapping):
        return call
    function = call.get("function")
    if not isinstance(function, Mapping) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except json.JSONDecodeError:
        return call
    return {**call, "function": {**function, "arguments": arguments}}


class ChatTemplate:
    """One compiled template and the special tokens it is rendered with; with
    ``max_chars``, a render that would write more (or repeat a sequence past it) fails."""

    def __init__(
        self,
        source: str,
        special_tokens: Mapping[str, Any] | None = None,
        *,
        max_chars: int | None = None,
    ) -> None:
        try:
            self._template = _environment(max_chars).from_string(source)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self.max_chars = max_chars

    def render(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """The rendered conversation. ``continue_final_message`` cuts the text after the
        last message's content (the model continues it) as transformers does."""
        if add_generation_prompt and continue_final_message:
            raise ChatTemplateError(
                "add_generation_prompt and continue_final_message exclude each other"
            )
        kwargs = {
            **self.special_tokens,
            **template_kwargs,
            "messages": list(messages),
            "tools": None if tools is None else list(tools),
            "documents": None if documents is None else list(documents),
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            text = self._render(kwargs)
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc
        if continue_final_message and messages:
            text = _cut_after_final(text, messages[-1])
        return text

    def _render(self, kwargs: dict[str, Any]) -> str:
        if self.max_chars is None:
            return self._template.render(**kwargs)
        parts: list[str] = []
        written = 0
        for part in self._template.generate(**kwargs):
            written += len(part)
            if written > self.max_chars:
                raise ChatTemplateError(
                    f"chat template: the rendered text is over the budget of "
                    f"{self.max_chars} characters"
                )
            parts.append(part)
        return "".join(parts)


def _cut_after_final(text: str, final: Message) -> str:
    content = final.get("content")
    if isinstance(content, list):
        texts = [p.get("text", "") for p in content if isinstance(p, Mapping)]
        content = texts[-1] if texts else ""
    final_text = str(content or "")
    stripped = final_text.strip()
    if stripped not in text:
        raise ChatTemplateError("the final message's content is not in the rendered chat")
    at = text.rindex(stripped)
    if text[at : at + len(final_text.lstrip())] == final_text:
        return text[: at + len(final_text.lstrip())]
    return text[: at + len(stripped)]

"""A model's answer as OpenAI's chat message and chunk deltas: reasoning, content and tool
calls, parsed from the whole text so far each time text arrives (the formats give only
what can no longer change, so each delta extends what was sent). Parsing the whole text
again costs time linear in the answer per delta; an answer read for nothing but content
skips it.

A streamed call comes as OpenAI sends one: a first delta with ``index``, ``id``, ``type``
and ``function.name`` (arguments ``""``), then pieces of ``function.arguments`` that add up
to the arguments' text."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from router.tool_calls.calls import RawCall, Split
from router.tool_calls.formats import ToolCallFormat
from router.tool_calls.reasoning import ReasoningFormat, split_reasoning

__all__ = ["AnswerParser", "Message"]


@dataclass(slots=True)
class Message:
    """The whole answer: what a non-streamed response's message holds."""

    content: str | None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def _call(index_id: str, call: RawCall) -> dict[str, Any]:
    return {"id": index_id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}  # fmt: skip


class AnswerParser:
    """Parses one answer: ``push`` each text delta, then ``finish``; ``message`` for the
    whole answer at once."""

    def __init__(
        self,
        tools: ToolCallFormat | None,
        reasoning: ReasoningFormat | None,
        call_id: Callable[[int], str],
        *,
        parallel: bool = True,
    ) -> None:
        self._tools, self._reasoning, self._call_id = tools, reasoning, call_id
        self._parallel = parallel
        self._text = ""
        self._sent_reasoning = self._sent_content = 0
        self._sent_args: list[int] = []  # per call given out: argument characters sent
        self.called = False  # a tool call was given out (finish_reason "tool_calls")

    def _parts(self, final: bool) -> tuple[str, Split]:
        text, reasoning = self._text, ""
        if self._reasoning is not None:
            thought = split_reasoning(text, self._reasoning, final)
            text, reasoning = thought.answer, thought.reasoning
        split = Split(text) if self._tools is None else self._tools.split(text, final)
        if not self._parallel and len(split.calls) > 1:
            split = Split(split.content, split.calls[:1])
        return reasoning, split

    def message(self, text: str) -> Message:
        """The whole answer parsed (calls only when all are valid, else all content)."""
        self._text = text
        reasoning, split = self._parts(final=True)
        calls = [_call(self._call_id(i), c) for i, c in enumerate(split.calls)]
        self.called = bool(calls)
        content = split.content if split.content.strip() or not calls else None
        return Message(content, reasoning or None, calls)

    def push(self, text: str) -> list[dict[str, Any]]:
        """The deltas (``{"content": ...}``, ``{"reasoning_content": ...}``,
        ``{"tool_calls": [...]}``) that ``text`` adds."""
        if self._tools is None and self._reasoning is None:  # all content: nothing to hold
            self._sent_content += len(text)
            return [{"content": text}] if text else []
        self._text += text
        return self._deltas(final=False)

    def finish(self) -> list[dict[str, Any]]:
        """The deltas still held back, at the end of the answer."""
        if self._tools is None and self._reasoning is None:
            return []
        return self._deltas(final=True)

    def _deltas(self, final: bool) -> list[dict[str, Any]]:
        reasoning, split = self._parts(final)
        out: list[dict[str, Any]] = []
        if len(reasoning) > self._sent_reasoning:
            out.append({"reasoning_content": reasoning[self._sent_reasoning :]})
            self._sent_reasoning = len(reasoning)
        content = split.content
        if split.malformed and self._sent_args:
            content = ""  # calls went out already: what follows cannot be taken back
        if len(content) > self._sent_content:
            out.append({"content": content[self._sent_content :]})
            self._sent_content = len(content)
        calls: list[dict[str, Any]] = []
        for index, call in enumerate(split.calls):
            if call.name is None:
                break
            if index == len(self._sent_args):
                first = {"id": self._call_id(index), "type": "function",
                         "function": {"name": call.name, "arguments": ""}}  # fmt: skip
                calls.append({"index": index, **first})
                self._sent_args.append(0)
            piece = call.arguments[self._sent_args[index] :]
            if piece:
                calls.append({"index": index, "function": {"arguments": piece}})
                self._sent_args[index] = len(call.arguments)
        if calls:
            self.called = True
            out.extend({"tool_calls": [call]} for call in calls)  # one chunk each, as OpenAI
        return out

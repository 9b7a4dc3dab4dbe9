"""The tool-call formats of the main open model families, each a parser of the whole
text so far (``split(text, final)``): content before the calls, then the calls.

- ``hermes`` (Hermes, Qwen 2.5/3): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  repeated;
- ``llama3_json`` (Llama 3.1-3.3): the whole answer is ``{"name": ..., "parameters": {...}}``
  (optionally after ``<|python_tag|>``), several separated by ``;``;
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``, or the newer
  ``[TOOL_CALLS]name[ARGS]{...}``;
- ``deepseek_v3``: ``<|tool▁calls▁begin|><|tool▁call▁begin|>function<|tool▁sep|>name``
  (the bars are U+FF5C) then the arguments in a json code block (V3) or right after the
  separator (V3.1), each call closed by ``<|tool▁call▁end|>``;
- ``json_array`` and ``named``: what the router's structured output makes the model write
  for ``tool_choice`` "required" (an array of ``{"name", "parameters"}``) or a named
  function (its arguments object alone).

Written for this router rather than taken from vLLM or SGLang, whose parsers live inside
their serving processes and cannot be installed alone.
"""

from __future__ import annotations

from typing import Literal, Protocol

from router.tool_calls.calls import RawCall, Split, held_back, json_call, valid_arguments
from router.tool_calls.json_span import skip_space, value_end

__all__ = [
    "FORMATS",
    "ToolCallFormat",
    "ToolFormatName",
    "detect_format",
    "format_named",
]

ToolFormatName = Literal["hermes", "llama3_json", "mistral", "deepseek_v3"]


class ToolCallFormat(Protocol):
    def split(self, text: str, final: bool) -> Split:
        """The content and calls of ``text``; ``final``: no more text follows (a cut
        call makes the whole text content, ``malformed`` set)."""
        ...


def _finished(content: str, calls: list[RawCall], text: str, final: bool) -> Split:
    """The split, or at the end of a text whose calls are cut or not valid, all content."""
    if final and (not calls or not all(c.complete and valid_arguments(c) for c in calls)):
        return Split(text, [], malformed=True)
    return Split(content, calls)


class Hermes:
    START, END = "<tool_call>", "</tool_call>"

    def split(self, text: str, final: bool) -> Split:
        at = text.find(self.START)
        if at < 0:
            return Split(text if final else held_back(text, self.START))
        calls: list[RawCall] = []
        while at >= 0:
            call, end = json_call(text, skip_space(text, at + len(self.START)))
            if call is None:
                return _finished(text[:at], [], text, final=True)
            calls.append(call)
            close = -1 if end is None else text.find(self.END, end)
            if close < 0:
                break
            at = text.find(self.START, close + len(self.END))
        return _finished(text[: text.find(self.START)], calls, text, final)


def _json_calls(text: str, at: int, separator: str) -> tuple[list[RawCall], bool]:
    """Call objects from ``at`` on, ``separator`` between them: the calls, and whether
    what arrived is not such a list."""
    calls: list[RawCall] = []
    while True:
        at = skip_space(text, at)
        if at >= len(text):
            return calls, False
        call, end = json_call(text, at)
        if call is None:
            return calls, True
        calls.append(call)
        if end is None:
            return calls, False
        at = skip_space(text, end)
        if at >= len(text) or text[at] != separator:
            return calls, False
        at += 1


class Llama3Json:
    TAG = "<|python_tag|>"

    def split(self, text: str, final: bool) -> Split:
        lead = skip_space(text, 0)
        if text.startswith(self.TAG, lead):
            lead = skip_space(text, lead + len(self.TAG))
        elif self.TAG.startswith(text[lead:]) and not final:
            return Split("")
        if lead >= len(text):
            return Split(text if final else "")
        if text[lead] != "{":
            return Split(text)
        calls, malformed = _json_calls(text, lead, ";")
        if malformed or not calls:
            return Split(text, [], malformed=malformed)
        return _finished("", calls, text, final)


class Mistral:
    START, ARGS = "[TOOL_CALLS]", "[ARGS]"

    def split(self, text: str, final: bool) -> Split:
        at = text.find(self.START)
        if at < 0:
            return Split(text if final else held_back(text, self.START))
        content, body = text[:at], skip_space(text, at + len(self.START))
        if body >= len(text):
            return _finished(content, [], text, final)
        if text[body] == "[" and not text.startswith(self.ARGS, body):
            calls, malformed = _json_calls(text, body + 1, ",")
            if malformed:
                return Split(text, [], malformed=True)
            return _finished(content, calls, text, final)
        return _finished(content, self._named_calls(text, at), text, final)

    def _named_calls(self, text: str, at: int) -> list[RawCall]:
        """``[TOOL_CALLS]name[ARGS]{...}`` repeated."""
        calls: list[RawCall] = []
        while at >= 0:
            start = at + len(self.START)
            args = text.find(self.ARGS, start)
            if args < 0:
                break
            name = text[start:args].strip()
            begin = skip_space(text, args + len(self.ARGS))
            end = value_end(text, begin)
            calls.append(RawCall(name, text[begin : len(text) if end is None else end],
                                 complete=end is not None))  # fmt: skip
            if end is None:
                break
            at = text.find(self.START, end)
        return calls


def _deepseek(name: str) -> str:
    """One of DeepSeek's special tokens: its name between full-width bars (U+FF5C)."""
    return f"<\uff5c{name}\uff5c>"


class DeepSeekV3:
    START = _deepseek("tool▁calls▁begin")
    CALL, SEP = _deepseek("tool▁call▁begin"), _deepseek("tool▁sep")
    CALL_END = _deepseek("tool▁call▁end")
    FENCE = "```json"

    def split(self, text: str, final: bool) -> Split:
        at = text.find(self.START)
        if at < 0:
            return Split(text if final else held_back(text, self.START))
        calls: list[RawCall] = []
        call = text.find(self.CALL, at)
        while call >= 0:
            found = self._call(text, call + len(self.CALL))
            if found is None:
                break
            raw, end = found
            calls.append(raw)
            if end is None:
                break
            call = text.find(self.CALL, end)
        return _finished(text[:at], calls, text, final)

    def _call(self, text: str, start: int) -> tuple[RawCall, int | None] | None:
        sep = text.find(self.SEP, start)
        if sep < 0:
            return None
        kind, after = text[start:sep].strip(), sep + len(self.SEP)
        if kind == "function":  # V3: the name on its line, the arguments in a code block
            line = text.find("\n", after)
            if line < 0:
                return None
            name, begin = text[after:line].strip(), skip_space(text, line)
            if text.startswith(self.FENCE, begin):
                begin = skip_space(text, begin + len(self.FENCE))
            elif self.FENCE.startswith(text[begin:]):
                return RawCall(name, "", complete=False), None
        else:  # V3.1: the name before the separator, the arguments right after it
            name, begin = kind, skip_space(text, after)
        end = value_end(text, begin)
        arguments = text[begin : len(text) if end is None else end]
        closed = -1 if end is None else text.find(self.CALL_END, end)
        return RawCall(name, arguments, complete=closed >= 0), (
            None if closed < 0 else closed + len(self.CALL_END)
        )


class JsonArray:
    """``[{"name": ..., "parameters": {...}}, ...]``: the whole answer, as the schema
    the router sends for ``tool_choice: "required"`` makes the model write it."""

    def split(self, text: str, final: bool) -> Split:
        at = skip_space(text, 0)
        if at >= len(text):
            return Split("" if not final else text, [], malformed=final)
        if text[at] != "[":
            return Split(text, [], malformed=True)
        calls, malformed = _json_calls(text, at + 1, ",")
        if malformed:
            return Split(text, [], malformed=True)
        return _finished("", calls, text, final)


class Named:
    """The arguments object of the function ``tool_choice`` names: the whole answer."""

    def __init__(self, name: str) -> None:
        self.name = name

    def split(self, text: str, final: bool) -> Split:
        at = skip_space(text, 0)
        end = value_end(text, at)
        call = RawCall(self.name, text[at : len(text) if end is None else end], end is not None)
        return _finished("", [call], text, final)


FORMATS: dict[ToolFormatName, ToolCallFormat] = {
    "hermes": Hermes(),
    "llama3_json": Llama3Json(),
    "mistral": Mistral(),
    "deepseek_v3": DeepSeekV3(),
}


def format_named(name: str) -> ToolCallFormat:
    """The parser of a named function's arguments (``tool_choice`` naming one)."""
    return Named(name)


def detect_format(template: str | None) -> ToolFormatName | None:
    """The format a chat template teaches its model, from the markers it writes (None:
    none recognized; the model's settings may name one)."""
    if not template:
        return None
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "tool▁calls▁begin" in template:
        return "deepseek_v3"
    if "<|python_tag|>" in template or ('"parameters"' in template and "ipython" in template):
        return "llama3_json"
    return None

"""What a tool-call parser finds in a model's text: the content around the calls and each
call's name and raw argument text, both safe to give out while the text still arrives."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import partial_json_parser
from partial_json_parser import Allow

from router.tool_calls.json_span import object_members, value_end

__all__ = ["RawCall", "Split", "held_back", "json_call", "valid_arguments"]

ARGUMENT_KEYS = ("arguments", "parameters")
"""Where the families write a call's arguments: Hermes, Mistral and DeepSeek
``arguments``, Llama 3 ``parameters``."""


@dataclass(frozen=True, slots=True)
class RawCall:
    """One call as far as it has arrived: the name once whole, the argument text the
    model wrote so far (always a prefix of its final text), and whether it is whole."""

    name: str | None
    arguments: str
    complete: bool


@dataclass(frozen=True, slots=True)
class Split:
    """A text cut into its content and its calls. While text arrives, ``content`` never
    shrinks nor changes what it held (a possible start of a call is held back)."""

    content: str
    calls: list[RawCall] = field(default_factory=list)
    malformed: bool = False  # calls began but are not valid: the text is content


def held_back(text: str, marker: str) -> str:
    """``text`` without a tail that could be the start of ``marker``."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return text[:-size]
    return text


def _name_of(text: str, start: int, end: int | None) -> str | None:
    """The call's name once its string is whole: partial_json_parser reads the object
    still arriving and, with incomplete strings not allowed, leaves a cut name out."""
    try:
        parsed = partial_json_parser.loads(text[start:end], Allow.ALL & ~Allow.STR)
    except Exception:  # the library raises its own malformed-JSON errors
        return None
    name = parsed.get("name") if isinstance(parsed, dict) else None
    return name if isinstance(name, str) else None


def json_call(text: str, start: int) -> tuple[RawCall | None, int | None]:
    """A ``{"name": ..., "arguments"|"parameters": {...}}`` object starting at ``start``:
    the call so far (None when what arrived is not such an object) and the index just past
    the object (None while it is arriving)."""
    if start >= len(text):
        return RawCall(None, "", complete=False), None
    if text[start] != "{":
        return None, None
    members = object_members(text, start)
    end = value_end(text, start)
    first = next(iter(members), None)
    if first is not None and first != "name" and first not in ARGUMENT_KEYS:
        return None, None
    name = _name_of(text, start, end) if "name" in members else None
    span = next((members[k] for k in ARGUMENT_KEYS if k in members), None)
    arguments = ""
    if span is not None:
        begin, stop = span
        raw = text[begin : len(text) if stop is None else stop]
        quoted = raw.startswith('"')  # arguments written as a JSON string holding JSON
        arguments = raw if not quoted else _string_value(raw) if stop is not None else ""
    if end is None:
        return RawCall(name, arguments, complete=False), None
    if name is None:
        return None, end
    return RawCall(name, arguments if span is not None else "{}", complete=True), end


def _string_value(raw: str) -> str:
    try:
        value = json.loads(raw)
    except ValueError:
        return ""
    return value if isinstance(value, str) else ""


def valid_arguments(call: RawCall) -> bool:
    """A whole call's arguments are a JSON object."""
    try:
        return isinstance(json.loads(call.arguments), dict)
    except ValueError:
        return False

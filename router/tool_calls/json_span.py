"""Where a JSON value ends in text that may still be arriving.

Written here rather than taken from a JSON library: the streamed tool-call parsers need
the exact character span of one value inside a larger text (the raw ``arguments`` object
the model wrote), which ``json`` only gives for a complete document and
``partial_json_parser`` does not give at all."""

from __future__ import annotations

__all__ = ["object_members", "value_end"]

_OPEN = {"{": "}", "[": "]"}
_WHITESPACE = " \t\r\n"


def skip_space(text: str, at: int) -> int:
    """The index of the first character at or after ``at`` that is not JSON whitespace."""
    while at < len(text) and text[at] in _WHITESPACE:
        at += 1
    return at


def value_end(text: str, start: int) -> int | None:
    """The index just past the JSON value that starts at ``start`` (None: not complete yet).

    Scalars other than strings end at the next delimiter, so a number at the very end of
    ``text`` counts as incomplete: more digits may follow."""
    if start >= len(text):
        return None
    first = text[start]
    if first == '"':
        return _string_end(text, start)
    if first in _OPEN:
        return _container_end(text, start)
    at = start
    while at < len(text) and text[at] not in ",}] \t\r\n":
        at += 1
    return at if at < len(text) else None


def _string_end(text: str, start: int) -> int | None:
    at = start + 1
    while at < len(text):
        char = text[at]
        if char == "\\":
            at += 2
            continue
        if char == '"':
            return at + 1
        at += 1
    return None


def _container_end(text: str, start: int) -> int | None:
    closers = [_OPEN[text[start]]]
    at = start + 1
    while at < len(text):
        char = text[at]
        if char == '"':
            end = _string_end(text, at)
            if end is None:
                return None
            at = end
            continue
        if char in _OPEN:
            closers.append(_OPEN[char])
        elif closers and char == closers[-1]:
            closers.pop()
            if not closers:
                return at + 1
        at += 1
    return None


def object_members(text: str, start: int) -> dict[str, tuple[int, int | None]]:
    """The members of the object starting at ``start`` seen so far: each key (complete)
    with the span of its value (the end None while the value is arriving)."""
    members: dict[str, tuple[int, int | None]] = {}
    if start >= len(text) or text[start] != "{":
        return members
    at = start + 1
    while True:
        at = skip_space(text, at)
        if at >= len(text) or text[at] != '"':
            return members
        key_end = _string_end(text, at)
        if key_end is None:
            return members
        key = text[at + 1 : key_end - 1]
        at = skip_space(text, key_end)
        if at >= len(text) or text[at] != ":":
            return members
        at = skip_space(text, at + 1)
        if at >= len(text):
            return members
        end = value_end(text, at)
        members[key] = (at, end)
        if end is None:
            return members
        at = skip_space(text, end)
        if at >= len(text) or text[at] != ",":
            return members
        at += 1

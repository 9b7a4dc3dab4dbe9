"""Typed fields out of one decoded trace line, or a UserError naming file, line and field.

Every reader goes through these helpers so that a malformed line always stops the
read with the same one-line message shape::

    traces/x.jsonl:17: field 'input_length' must be a non-negative integer, got -3

Nothing is skipped silently: a line is either a request or an error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from router.errors import UserError

__all__ = ["Line", "describe", "json_lines"]

_INTS = frozenset({int})
_decode_json = msgspec.json.decode


def describe(value: object) -> str:
    """A short rendering of a bad value for an error message."""
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else None
    if text is None:
        text = type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True, slots=True)
class Line:
    """Where a record comes from (file and 1-based line number) and how to complain about it."""

    source: str
    number: int

    def error(self, message: str) -> UserError:
        """A UserError prefixed with ``file:line:``."""
        return UserError(f"{self.source}:{self.number}: {message}")

    def field_error(self, name: str, expected: str, value: object) -> UserError:
        """A UserError for a field holding the wrong kind of value."""
        return self.error(f"field '{name}' must be {expected}, got {describe(value)}")

    def decode_json(self, raw: bytes | str) -> Mapping[str, Any]:
        """Decode one JSON object (a line of a JSONL trace).

        msgspec decodes a line to the same values as ``json.loads``, several times
        faster; what it refuses (``NaN``, lone surrogates, bad JSON) goes to ``json.loads``,
        which accepts the same lines as ever and words the same errors."""
        try:
            obj = _decode_json(raw)
        except msgspec.DecodeError:
            obj = self._decode_stdlib(raw)
        if not isinstance(obj, dict):
            raise self.error(f"expected a JSON object, got {type(obj).__name__}")
        return obj

    def _decode_stdlib(self, raw: bytes | str) -> Any:
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            # some messages end in "at" ("Invalid control character at"): not twice
            message = exc.msg.removesuffix(" at")
            raise self.error(f"invalid JSON ({message} at column {exc.colno})") from None
        except ValueError as exc:  # undecodable bytes
            raise self.error(f"invalid JSON ({exc})") from None

    def require(self, record: Mapping[str, Any], name: str) -> Any:
        """The raw value of a field that must be present."""
        try:
            return record[name]
        except KeyError:
            raise self.error(f"missing field '{name}'") from None

    def count(self, record: Mapping[str, Any], name: str) -> int:
        """A non-negative integer field (token counts)."""
        value = self.require(record, name)
        if type(value) is not int or value < 0:
            raise self.field_error(name, "a non-negative integer", value)
        return value

    def integer(self, record: Mapping[str, Any], name: str) -> int:
        """An integer field of any sign (identifiers)."""
        value = self.require(record, name)
        if type(value) is not int:
            raise self.field_error(name, "an integer", value)
        return value

    def seconds(self, record: Mapping[str, Any], name: str, scale: float = 1.0) -> float:
        """A finite non-negative number, multiplied by ``scale`` (e.g. 1e-3 for milliseconds)."""
        self.require(record, name)
        seconds = self.optional_seconds(record, name, scale)
        if seconds is None:
            raise self.field_error(name, "a non-negative number", None)
        return seconds

    def optional_seconds(
        self, record: Mapping[str, Any], name: str, scale: float = 1.0, label: str | None = None
    ) -> float | None:
        """``seconds``, or None when the field is missing or null; errors name ``label``
        (default: ``name``)."""
        value = record.get(name)
        if value is None:
            return None
        if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
            raise self.field_error(label or name, "a non-negative number", value)
        return float(value) * scale

    def text(self, record: Mapping[str, Any], name: str) -> str:
        """A string field."""
        value = self.require(record, name)
        if not isinstance(value, str):
            raise self.field_error(name, "a string", value)
        return value

    def block_ids(self, record: Mapping[str, Any], name: str) -> tuple[int, ...]:
        """A list of integer block IDs (its consistency with input_length is not checked)."""
        value = self.require(record, name)
        if not isinstance(value, list):
            raise self.field_error(name, "a list of integers", value)
        if not _INTS.issuperset(map(type, value)):  # every one exactly an int (no bool)
            bad = next(x for x in value if type(x) is not int)
            raise self.field_error(name, "a list of integers", bad)
        return tuple(value)

    def optional_label(self, record: Mapping[str, Any], name: str) -> str | None:
        """An optional string or integer label (a session ID), as a string."""
        value = record.get(name)
        if value is None:
            return None
        if isinstance(value, str) or type(value) is int:
            return str(value)
        raise self.field_error(name, "a string or an integer", value)

    def optional_count(self, record: Mapping[str, Any], name: str) -> int | None:
        """An optional non-negative integer (a turn number)."""
        if record.get(name) is None:
            return None
        return self.count(record, name)


def json_lines(path: Path) -> Iterator[tuple[Line, bytes]]:
    """Each non-blank line of a JSONL file with its ``Line`` (file and number, for errors);
    a missing or unreadable file is a UserError naming it."""
    source = str(path)
    try:
        with path.open("rb") as stream:
            for number, raw in enumerate(stream, start=1):
                if raw.strip():
                    yield Line(source, number), raw
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None

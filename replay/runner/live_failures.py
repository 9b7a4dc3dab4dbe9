"""Why requests of a live run failed: the endpoint's own error message, and the failures
counted by reason (the numbers in a message masked, so that requests refused for the
same reason are counted together)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import msgspec

__all__ = ["REASON_CHARS", "error_message", "failure_kind", "failures"]

REASON_CHARS = 300
"""An endpoint's error message is kept to this many characters in a request's reason."""

_NUMBER = re.compile(r"\d+")


def error_message(body: bytes | dict[str, Any]) -> str | None:
    """The message of an error answer (a body, or a streamed event): OpenAI's
    ``{"error": {"message"}}`` (the router's, vLLM's), ``{"message"}``, FastAPI's
    ``{"detail"}``, else the start of a text body; None for an empty one."""
    data: Any = body
    if isinstance(body, bytes):
        try:
            data = msgspec.json.decode(body)
        except msgspec.DecodeError:
            data = body.decode("utf-8", "replace")
    if isinstance(data, dict):
        error = data.get("error")
        found = error.get("message") if isinstance(error, dict) else error
        data = found or data.get("message") or data.get("detail") or ""
    text = " ".join(str(data).split())
    return text[:REASON_CHARS] or None


def failure_kind(reason: str) -> str:
    """What failures are counted by: the reason with the numbers of its message masked
    (``HTTP 400: prompt holds token id 31999, ...`` and ``... 30001, ...`` are alike)."""
    head, sep, message = reason.partition(": ")
    return head + sep + _NUMBER.sub("#", message)


def failures(reasons: Iterable[str]) -> tuple[dict[str, int], list[str]]:
    """Failed requests counted by kind, and a warning for each kind (the most frequent
    first) with an example of its reason."""
    counts: dict[str, int] = {}
    examples: dict[str, set[str]] = {}
    for reason in reasons:
        kind = failure_kind(reason)
        counts[kind] = counts.get(kind, 0) + 1
        examples.setdefault(kind, set()).add(reason)
    warnings = []
    for kind, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        alike = " (with other numbers)" if len(examples[kind]) > 1 else ""
        noun = "request" if n == 1 else "requests"
        warnings.append(f"{n} {noun} failed: {min(examples[kind])}{alike}")
    return counts, warnings

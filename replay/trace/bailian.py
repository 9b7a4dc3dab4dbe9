"""Qwen-Bailian JSONL traces (alibaba-edu/qwen-bailian-usagetraces-anon).

One JSON object per line: ``chat_id`` (integer), ``parent_chat_id`` (-1 or null for
the first request of a conversation), ``timestamp`` (seconds from the start of the
trace), ``input_length``, ``output_length``, ``type`` ("text", "search", "image",
"file"), ``turn`` and ``hash_ids`` (IDs of 16-token blocks).

Sessions come from the chat chain: a chat without a parent starts a session named by
its own ``chat_id``; a child inherits its parent's session. A child whose parent was
not seen earlier in the file gets the session named by that parent's ``chat_id``,
so siblings of a missing parent still share one session.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from replay.trace.checks import TraceChecks
from replay.trace.fields import Line
from replay.trace.record import TraceRequest

__all__ = ["BAILIAN_BLOCK_SIZE", "parse_bailian"]

BAILIAN_BLOCK_SIZE = 16
"""Tokens per ``hash_ids`` block in Qwen-Bailian traces."""


def _parent(line: Line, record: Mapping[str, Any]) -> int | None:
    value = line.require(record, "parent_chat_id")
    if value is None:
        return None
    if type(value) is not int:
        raise line.field_error("parent_chat_id", "an integer or null", value)
    return None if value < 0 else value


def parse_bailian(
    lines: Iterable[bytes | str], source: str, checks: TraceChecks | None = None
) -> Iterator[TraceRequest]:
    """Yield one request per non-empty line; a malformed line raises a UserError.
    ``checks`` is shown each request with its line number."""
    root_of: dict[int, int] = {}
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        line = Line(source, number)
        record = line.decode_json(raw)
        chat_id = line.integer(record, "chat_id")
        parent = _parent(line, record)
        root = chat_id if parent is None else root_of.get(parent, parent)
        root_of[chat_id] = root
        request = TraceRequest(
            request_id=chat_id,
            arrival_s=line.seconds(record, "timestamp"),
            input_length=line.count(record, "input_length"),
            output_length=line.count(record, "output_length"),
            hash_ids=line.block_ids(record, "hash_ids"),
            block_size=BAILIAN_BLOCK_SIZE,
            session_id=str(root),
            parent_id=None if parent is None else str(parent),
            turn=line.count(record, "turn"),
            kind=line.text(record, "type"),
        )
        if checks is not None:
            checks.observe(number, request)
        yield request

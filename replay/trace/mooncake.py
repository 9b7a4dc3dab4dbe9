"""Mooncake JSONL traces (kvcache-ai/Mooncake FAST'25 release): read and write.

One JSON object per line: ``timestamp`` (arrival in milliseconds from the start of
the trace), ``input_length``, ``output_length`` and ``hash_ids`` (prefix-chained IDs
of 512-token blocks). Two optional fields that this project's synthetic traces add
are read when present: ``session_id`` (string or integer) and ``turn``. Other extra
fields are ignored.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Annotated, Any, TextIO

import msgspec

from replay.trace.checks import TraceChecks
from replay.trace.fields import Line
from replay.trace.record import TraceRequest

__all__ = [
    "MOONCAKE_BLOCK_SIZE",
    "mooncake_record",
    "parse_mooncake",
    "write_mooncake",
]

MOONCAKE_BLOCK_SIZE = 512
"""Tokens per ``hash_ids`` block in Mooncake traces."""

_Count = Annotated[int, msgspec.Meta(ge=0)]


class _WellFormed(msgspec.Struct):
    """A line as the field checks of ``Line`` accept it, decoded and checked in one pass;
    any other line (an error, or a value msgspec is stricter about) takes the slow path."""

    timestamp: Annotated[float, msgspec.Meta(ge=0)]
    input_length: _Count
    output_length: _Count
    hash_ids: tuple[int, ...]
    session_id: str | int | None = None
    turn: _Count | None = None


_decode_well_formed = msgspec.json.Decoder(_WellFormed).decode


def parse_mooncake(
    lines: Iterable[bytes | str], source: str, checks: TraceChecks | None = None
) -> Iterator[TraceRequest]:
    """Yield one request per non-empty line; a malformed line raises a UserError.
    ``checks`` is shown each request with its line number."""
    request_id = 0
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            r = _decode_well_formed(raw)
        except msgspec.DecodeError:  # ValidationError included
            request = _slow_path(Line(source, number), raw, request_id)
        else:
            sid = r.session_id
            request = TraceRequest(
                request_id, r.timestamp * 1e-3, r.input_length, r.output_length, r.hash_ids,
                MOONCAKE_BLOCK_SIZE, None if sid is None else str(sid), None, r.turn,
            )  # fmt: skip
        if checks is not None:
            checks.observe(number, request)
        yield request
        request_id += 1


def _slow_path(line: Line, raw: bytes | str, request_id: int) -> TraceRequest:
    """A line the fast decoder refused: field by field, naming what is wrong."""
    record = line.decode_json(raw)
    return TraceRequest(
        request_id=request_id,
        arrival_s=line.seconds(record, "timestamp", scale=1e-3),
        input_length=line.count(record, "input_length"),
        output_length=line.count(record, "output_length"),
        hash_ids=line.block_ids(record, "hash_ids"),
        block_size=MOONCAKE_BLOCK_SIZE,
        session_id=line.optional_label(record, "session_id"),
        turn=line.optional_count(record, "turn"),
    )


def mooncake_record(request: TraceRequest) -> dict[str, Any]:
    """The Mooncake JSON object of a request (timestamp rounded to whole milliseconds).

    ``session_id`` (an integer when the request's session ID is one) and ``turn`` are
    added when the request has them.
    """
    record: dict[str, Any] = {
        "timestamp": round(request.arrival_s * 1000),
        "input_length": request.input_length,
        "output_length": request.output_length,
        "hash_ids": list(request.hash_ids),
    }
    if request.session_id is not None:
        sid = request.session_id
        numeric = sid.isascii() and sid.isdigit() and str(int(sid)) == sid
        record["session_id"] = int(sid) if numeric else sid
    if request.turn is not None:
        record["turn"] = request.turn
    return record


def write_mooncake(requests: Iterable[TraceRequest], out: TextIO) -> int:
    """Write requests as Mooncake JSONL (one object per line); return how many were written.

    The block size of the requests is not recorded: Mooncake traces are read back with
    512-token blocks, so callers write requests of that block size.
    """
    count = 0
    for request in requests:
        out.write(json.dumps(mooncake_record(request)))
        out.write("\n")
        count += 1
    return count

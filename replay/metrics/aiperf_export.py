"""Reading NVIDIA aiperf's per-request export as latency records, so ``replay validate``
can set an aiperf run (for instance its Mooncake-trace replay with ``--fixed-schedule``)
against a simulated replay of the same trace.

The file is ``profile_export.jsonl`` in aiperf's artifact directory (aiperf 0.13, written
at ``--export-level records``, its default). One JSON object per request::

    {"metadata": {"conversation_id": "session_000004", "turn_index": 0,
                  "benchmark_phase": "profiling", "credit_issued_ns": int,
                  "request_start_ns": int, "request_end_ns": int, ...},
     "metrics": {"time_to_first_token": {"value": 211.07, "unit": "ms"},
                 "request_latency": {"value": 211.83, "unit": "ms"},
                 "usage_completion_tokens": {"value": 3, "unit": "tokens"},
                 "input_sequence_length": {"value": 6760, "unit": "tokens"}, ...},
     "error": {"code": 400, "type": ..., "message": ...}}    # only on a failed request

What each latency field is made of:

- ``ttft_s``: ``time_to_first_token`` (from when aiperf's worker sent the request to the
  first content chunk); ``e2e_s``: ``request_latency`` (to the last chunk).
- ``tpot_s``: ``(request_latency - time_to_first_token) / (tokens - 1)``, as ``replay
  live`` computes it, with ``tokens`` the server's ``usage_completion_tokens`` when it
  reported one. aiperf's own ``inter_token_latency`` is the same formula over
  ``output_sequence_length``, its client-side re-tokenization of the streamed text,
  which is not the server's count when the text does not round-trip through the
  tokenizer (engine-sim's random tokens: 730 counted for 500 generated); it is used only
  when the server reported no count.
- ``arrival_s``: ``credit_issued_ns`` (when aiperf's fixed schedule released the
  request; ``request_start_ns`` if absent) less the earliest one in the file, so the
  first request arrives at 0 as in a replay.
- ``input_length``: ``input_sequence_length`` (``error_isl`` on a failed request),
  aiperf's token count of the prompt it made for the trace line: the line's
  ``input_length`` unless ``--use-server-token-count`` swaps in the server's count;
  ``output_length``: ``usage_completion_tokens``, else ``output_sequence_length``.
- A request with an ``error``, or cancelled, is unfinished (no latencies); records of
  other phases than ``profiling`` (warmup) are left out.

The join. ``replay validate`` joins by ``request_id``, which in a replay is the trace's
line number (non-empty lines, from 0). aiperf keeps no line number, only the
conversation each request belongs to and its turn in it. Its Mooncake loader makes each
line without a ``session_id`` a conversation of its own, named by its session-ID
generator: with ``--random-seed``, ``session_000000``, ``session_000001``, ... counting
those lines in file order; without, a random UUID. A line with a ``session_id`` is turn
``k`` of that conversation (its ``k``-th line in the file). So:

- without the trace, every record must be ``session_NNNNNN``, turn 0 (aiperf run with
  ``--random-seed`` on a trace whose lines have no ``session_id``, the Mooncake
  release's own format), and its request_id is ``NNNNNN``;
- with the trace (``sessions_of(trace)``), the key (conversation, turn) of each line is
  rebuilt as aiperf numbers it and maps to the line's request_id, which also covers
  multi-turn traces.

Both hold only when aiperf loaded every line of the file: its
``--fixed-schedule-start-offset``/``--fixed-schedule-end-offset`` drop lines before
numbering, so give it a file cut to the slice instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from replay.metrics.latency_records import LatencyRecord
from replay.trace.fields import Line, json_lines
from replay.trace.record import TraceRequest
from router.errors import UserError

__all__ = [
    "AIPERF_EXPORT_FILE",
    "SessionKey",
    "is_aiperf_export",
    "read_aiperf_export",
    "sessions_of",
]

AIPERF_EXPORT_FILE = "profile_export.jsonl"
"""The per-request export's name in an aiperf artifact directory."""

SessionKey = tuple[str, int]
"""(conversation_id, turn_index): what aiperf records of a request's identity."""

_SEEDED_SESSION = re.compile(r"session_(\d{6,})")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}


def sessions_of(trace: Iterable[TraceRequest]) -> dict[SessionKey, int]:
    """The (conversation_id, turn_index) aiperf's Mooncake loader gives each line of
    ``trace``, mapped to the line's request_id (see the module doc)."""
    keys: dict[SessionKey, int] = {}
    unnamed = 0
    turns: dict[str, int] = {}
    for request in trace:
        if request.session_id is None:
            key = (f"session_{unnamed:06d}", 0)
            unnamed += 1
        else:
            key = (request.session_id, turns.get(request.session_id, 0))
            turns[request.session_id] = key[1] + 1
        keys[key] = request.request_id
    return keys


def is_aiperf_export(path: Path) -> bool:
    """Whether ``path`` (a file) reads as aiperf's per-request export: its first
    non-empty line is an object with ``metadata`` and ``metrics``."""
    try:
        with path.open("rb") as stream:
            for raw in stream:
                if raw.strip():
                    first = json.loads(raw)
                    return (
                        isinstance(first, dict)
                        and isinstance(first.get("metadata"), dict)
                        and "metrics" in first
                    )
    except (OSError, ValueError):
        return False
    return False


def _seconds(line: Line, metrics: Mapping[str, Any], name: str) -> float | None:
    entry = metrics.get(name)
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise line.field_error(f"metrics.{name}", "an object with value and unit", entry)
    unit = entry.get("unit")
    if unit not in _UNIT_SECONDS:
        raise line.field_error(f"metrics.{name}.unit", "one of ns, us, ms, s", unit)
    label = f"metrics.{name}.value"
    value = line.optional_seconds(entry, "value", _UNIT_SECONDS[unit], label=label)
    if value is None:
        raise line.field_error(label, "a non-negative number", None)
    return value


def _tokens(line: Line, metrics: Mapping[str, Any], name: str) -> int | None:
    entry = metrics.get(name)
    if entry is None:
        return None
    value = entry.get("value") if isinstance(entry, dict) else None
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is not int or value < 0:
        raise line.field_error(f"metrics.{name}.value", "a non-negative integer", value)
    return value


def _nanoseconds(line: Line, metadata: Mapping[str, Any], name: str) -> int | None:
    value = metadata.get(name)
    if value is None:
        return None
    if type(value) is not int:
        raise line.field_error(f"metadata.{name}", "an integer (nanoseconds)", value)
    return value


def _key(line: Line, metadata: Mapping[str, Any]) -> SessionKey:
    conversation = metadata.get("conversation_id")
    if not isinstance(conversation, str):
        raise line.field_error("metadata.conversation_id", "a string", conversation)
    turn = metadata.get("turn_index", 0)
    if type(turn) is not int or turn < 0:
        raise line.field_error("metadata.turn_index", "a non-negative integer", turn)
    return conversation, turn


def _request_id(line: Line, key: SessionKey, sessions: Mapping[SessionKey, int] | None) -> int:
    if sessions is not None:
        found = sessions.get(key)
        if found is None:
            raise line.error(
                f"conversation {key[0]!r} turn {key[1]} is not a line of the trace given: "
                "was aiperf run on that file, all of it (no --fixed-schedule-*-offset)?"
            )
        return found
    seeded = _SEEDED_SESSION.fullmatch(key[0])
    if seeded is None or key[1] != 0:
        raise line.error(
            f"conversation {key[0]!r} turn {key[1]} names no trace line by itself: aiperf "
            "numbers the lines session_000000, ... only with --random-seed and for lines "
            "without a session_id; give the trace it replayed (--trace) to match the others"
        )
    return int(seeded.group(1))


def read_aiperf_export(
    path: Path, sessions: Mapping[SessionKey, int] | None = None
) -> list[LatencyRecord]:
    """The records of aiperf's ``profile_export.jsonl`` (``path``, or an artifact
    directory holding it), request_ids as in the module doc: from ``sessions``
    (``sessions_of(trace)``) when given, else from aiperf's ``session_NNNNNN`` names.
    A UserError names the file and line of anything unreadable or unmatched."""
    if path.is_dir():
        path = path / AIPERF_EXPORT_FILE
    rows: list[tuple[Line, int, Mapping[str, Any], bool, int | None]] = []
    seen: dict[int, int] = {}
    for line, raw in json_lines(path):
        record = line.decode_json(raw)
        metadata = record.get("metadata")
        metrics = record.get("metrics", {})
        if not isinstance(metadata, dict):
            raise line.field_error("metadata", "an object", metadata)
        if not isinstance(metrics, dict):
            raise line.field_error("metrics", "an object", metrics)
        if metadata.get("benchmark_phase", "profiling") != "profiling":
            continue  # warmup requests are not the trace's
        request_id = _request_id(line, _key(line, metadata), sessions)
        first = seen.setdefault(request_id, line.number)
        if first != line.number:
            raise line.error(f"request {request_id} repeats line {first}")
        failed = record.get("error") is not None or metadata.get("was_cancelled") is True
        sent = _nanoseconds(line, metadata, "credit_issued_ns")
        if sent is None:
            sent = _nanoseconds(line, metadata, "request_start_ns")
        rows.append((line, request_id, metrics, failed, sent))
    if not rows:
        raise UserError(f"{path}: no profiling requests in aiperf's export")
    starts = [sent for *_, sent in rows if sent is not None]
    zero = min(starts) if starts else None
    return [_record(*row, zero) for row in rows]


def _record(
    line: Line,
    request_id: int,
    metrics: Mapping[str, Any],
    failed: bool,
    sent: int | None,
    zero: int | None,
) -> LatencyRecord:
    arrival = None if sent is None or zero is None else round((sent - zero) * 1e-9, 6)
    input_length = _tokens(line, metrics, "input_sequence_length")
    if input_length is None:
        input_length = _tokens(line, metrics, "error_isl")
    if failed:
        return LatencyRecord(request_id, arrival_s=arrival, input_length=input_length)
    reported = _tokens(line, metrics, "usage_completion_tokens")
    counted = _tokens(line, metrics, "output_sequence_length")
    tokens = reported if reported is not None else counted
    ttft = _seconds(line, metrics, "time_to_first_token")
    e2e = _seconds(line, metrics, "request_latency")
    tpot = None
    if reported is not None and ttft is not None and e2e is not None and reported > 1:
        tpot = max(0.0, e2e - ttft) / (reported - 1)
    elif reported is None:
        tpot = _seconds(line, metrics, "inter_token_latency")

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 9)

    return LatencyRecord(
        request_id=request_id,
        ttft_s=r(ttft),
        tpot_s=r(tpot),
        e2e_s=r(e2e),
        arrival_s=arrival,
        input_length=input_length,
        output_length=tokens,
    )

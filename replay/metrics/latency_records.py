"""Reading requests.jsonl back: the latency fields of each request, for comparing runs
(``replay validate``). Only the fields read are kept; any other is ignored, so files of
older versions and of live runs read alike."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from replay.trace.fields import Line, json_lines
from router.errors import UserError

__all__ = ["LatencyRecord", "read_requests", "requests_file"]


@dataclass(frozen=True, slots=True)
class LatencyRecord:
    """The fields of one requests.jsonl line that validation reads; None: not reached or
    not in the file."""

    request_id: int
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    ttft_prefill_s: float | None = None
    arrival_s: float | None = None
    input_length: int | None = None
    output_length: int | None = None


def requests_file(path: Path) -> Path:
    """``path`` itself, or ``path/requests.jsonl`` when it is a run directory."""
    if path.is_dir():
        inner = path / "requests.jsonl"
        if not inner.is_file():
            raise UserError(f"{path}: a directory without requests.jsonl")
        return inner
    return path


def _record(line: Line, raw: bytes) -> LatencyRecord:
    record = line.decode_json(raw)
    return LatencyRecord(
        request_id=line.integer(record, "request_id"),
        ttft_s=line.optional_seconds(record, "ttft_s"),
        tpot_s=line.optional_seconds(record, "tpot_s"),
        e2e_s=line.optional_seconds(record, "e2e_s"),
        ttft_prefill_s=line.optional_seconds(record, "ttft_prefill_s"),
        arrival_s=line.optional_seconds(record, "arrival_s"),
        input_length=line.optional_count(record, "input_length"),
        output_length=line.optional_count(record, "output_length"),
    )


def read_requests(path: Path) -> list[LatencyRecord]:
    """The records of a requests.jsonl (or a run directory's); a UserError naming the
    file and line for anything unreadable, a duplicate request_id or an empty file."""
    path = requests_file(path)
    records: list[LatencyRecord] = []
    seen: dict[int, int] = {}
    for line, raw in json_lines(path):
        record = _record(line, raw)
        first = seen.setdefault(record.request_id, line.number)
        if first != line.number:
            raise line.error(f"request_id {record.request_id} repeats line {first}")
        records.append(record)
    if not records:
        raise UserError(f"{path}: no requests in the file")
    return records

"""The per-request latencies of a run, whichever wrote them: the replay's own
``requests.jsonl`` (``replay run``, ``replay live``) or NVIDIA aiperf's
``profile_export.jsonl`` (``replay.metrics.aiperf_export``). A file is told by its
content, a run directory by the file it holds."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from replay.metrics.aiperf_export import (
    AIPERF_EXPORT_FILE,
    SessionKey,
    is_aiperf_export,
    read_aiperf_export,
)
from replay.metrics.latency_records import LatencyRecord, read_requests
from router.errors import UserError

__all__ = ["latency_file", "read_latencies"]


def latency_file(path: Path) -> Path:
    """``path`` itself, or the per-request file of a run directory: ``requests.jsonl``,
    else aiperf's ``profile_export.jsonl``."""
    if not path.is_dir():
        return path
    for name in ("requests.jsonl", AIPERF_EXPORT_FILE):
        if (path / name).is_file():
            return path / name
    raise UserError(
        f"{path}: a directory without requests.jsonl (a replay's) or {AIPERF_EXPORT_FILE} "
        "(aiperf's, written at --export-level records)"
    )


def read_latencies(
    path: Path, sessions: Mapping[SessionKey, int] | None = None
) -> list[LatencyRecord]:
    """The records of ``path`` (a file or a run directory). ``sessions`` maps aiperf's
    (conversation, turn) to the trace's request_ids (``aiperf_export.sessions_of``); a
    replay's file ignores it."""
    path = latency_file(path)
    if is_aiperf_export(path):
        return read_aiperf_export(path, sessions)
    if not _starts_like_requests(path):
        raise UserError(
            f"{path}: its first line is not a per-request record (a JSON object with "
            f"request_id): expected a replay's requests.jsonl (replay run, replay live), "
            f"aiperf's {AIPERF_EXPORT_FILE}, or the run directory holding one"
        )
    return read_requests(path)


def _starts_like_requests(path: Path) -> bool:
    """Whether the first non-empty line of ``path`` is a JSON object with a request_id,
    as a requests.jsonl's are (a summary.json, a trace or a report is not). A file that
    cannot be read, or is empty, passes: ``read_requests`` then says what is wrong."""
    try:
        with path.open("rb") as stream:
            raw = next((line for line in stream if line.strip()), None)
    except OSError:
        return True
    if raw is None:
        return True
    try:
        first = json.loads(raw)
    except ValueError:
        return False
    return isinstance(first, dict) and "request_id" in first

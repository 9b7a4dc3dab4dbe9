"""The per-request latencies of a run, whichever wrote them: the replay's own
``requests.jsonl`` (``replay run``, ``replay live``) or NVIDIA aiperf's
``profile_export.jsonl`` (``replay.metrics.aiperf_export``). A file is told by its
content, a run directory by the file it holds."""

from __future__ import annotations

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
    return read_requests(path)

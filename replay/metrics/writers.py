"""Write a run's data: summary.json (authoritative) and requests.jsonl. Rendering is in
``replay.report``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from replay.metrics.record import RequestRecord
from replay.metrics.summary import Summary

__all__ = ["write_requests", "write_run", "write_summary"]


def write_summary(path: Path, summary: Summary) -> None:
    path.write_text(json.dumps(summary.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")


def write_requests(path: Path, records: Sequence[RequestRecord]) -> None:
    with path.open("w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record.to_json(), separators=(",", ":")))
            out.write("\n")


def write_run(out_dir: Path, summary: Summary, records: Sequence[RequestRecord]) -> None:
    """``out_dir/summary.json`` and ``out_dir/requests.jsonl`` (the folder is created)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_summary(out_dir / "summary.json", summary)
    write_requests(out_dir / "requests.jsonl", records)

"""Write a run's data: summary.json (authoritative), requests.jsonl and timeline.csv (the
summary's timeline, for a spreadsheet). Rendering is in ``replay.report``."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

from replay.metrics.record import RequestRecord
from replay.metrics.summary import Summary
from replay.metrics.timeline import TimelineSummary

__all__ = ["write_requests", "write_run", "write_summary", "write_timeline"]


def write_summary(path: Path, summary: Summary) -> None:
    path.write_text(json.dumps(summary.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")


def write_requests(path: Path, records: Sequence[RequestRecord]) -> None:
    with path.open("w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record.to_json(), separators=(",", ":")))
            out.write("\n")


def write_timeline(path: Path, timeline: TimelineSummary) -> None:
    """One row per window: its start, the line's rate, backlog and busy share, each tier's
    utilization (share of the window busy) and KV occupancy."""
    tiers = list(timeline.utilization)
    header = ["t_s", "wan_gbps", "wan_backlog_gb", "wan_busy"]
    header += [f"utilization_{t}" for t in tiers] + [f"kv_used_{t}" for t in tiers]
    with path.open("w", encoding="utf-8", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(header)
        for i, t in enumerate(timeline.t_s):
            row: list[float | str] = [t]
            for series in (timeline.wan_gbps, timeline.wan_backlog_gb, timeline.wan_busy):
                row.append(series[i] if series else "")
            row += [timeline.utilization[tier][i] for tier in tiers]
            row += [timeline.kv_used[tier][i] for tier in tiers]
            writer.writerow(row)


def write_run(out_dir: Path, summary: Summary, records: Sequence[RequestRecord]) -> list[Path]:
    """``out_dir/summary.json``, ``out_dir/requests.jsonl`` and, when the run sampled its
    load, ``out_dir/timeline.csv`` (the folder is created); the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [out_dir / "summary.json", out_dir / "requests.jsonl"]
    write_summary(files[0], summary)
    write_requests(files[1], records)
    if summary.timeline is not None:
        files.append(out_dir / "timeline.csv")
        write_timeline(files[-1], summary.timeline)
    return files

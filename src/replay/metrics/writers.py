"""Write a run directory: summary.json (authoritative), requests.jsonl and report.html."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from replay.metrics.record import RequestRecord
from replay.metrics.summary import Summary

__all__ = ["write_report_of_run", "write_requests", "write_run", "write_summary"]


def write_summary(path: Path, summary: Summary) -> None:
    path.write_text(json.dumps(summary.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")


def write_requests(path: Path, records: Sequence[RequestRecord]) -> None:
    with path.open("w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record.to_json(), separators=(",", ":")))
            out.write("\n")


def write_report_of_run(
    path: Path,
    summary: Summary,
    records: Sequence[RequestRecord],
    *,
    overrides: Mapping[str, Any] | None = None,
    command: str | None = None,
) -> None:
    """The run's self-contained report.html (bucketed by the trace file's hit rates when
    ``summary.trace`` can still be read; capacities from the preset with ``overrides``)."""
    from replay.hit_buckets import load_hit_rates
    from replay.report import ClusterFacts, Report, ReportRun, write_report

    report = Report(
        "run",
        [ReportRun(summary.policy, summary, records)],
        command=command,
        hit_rates=load_hit_rates(summary.trace),
        cluster=ClusterFacts.of_preset(summary.preset, overrides),
    )
    write_report(path, report)


def write_run(
    out_dir: Path,
    summary: Summary,
    records: Sequence[RequestRecord],
    *,
    report: bool = True,
    overrides: Mapping[str, Any] | None = None,
    command: str | None = None,
) -> None:
    """``out_dir/summary.json``, ``out_dir/requests.jsonl`` and, with ``report``,
    ``out_dir/report.html`` (the folder is created). ``overrides`` are the run's preset
    overrides, for the capacities the report draws; ``command`` is shown in the report."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_summary(out_dir / "summary.json", summary)
    write_requests(out_dir / "requests.jsonl", records)
    if report and records:
        write_report_of_run(
            out_dir / "report.html", summary, records, overrides=overrides, command=command
        )

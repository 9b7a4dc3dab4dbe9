"""A replay's run directory with its report: the data files and ``report.html``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from replay.metrics.hit_buckets import load_hit_rates
from replay.metrics.record import RequestRecord
from replay.metrics.summary import Summary
from replay.metrics.writers import write_run
from replay.report.model import ClusterFacts, Report, ReportRun
from replay.report.render import write_report

__all__ = ["write_report_of_run", "write_run_with_report"]


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
    report = Report(
        "run",
        [ReportRun(summary.policy, summary, records)],
        command=command,
        hit_rates=load_hit_rates(summary.trace),
        cluster=ClusterFacts.of_preset(summary.preset, overrides),
    )
    write_report(path, report)


def write_run_with_report(
    out_dir: Path,
    summary: Summary,
    records: Sequence[RequestRecord],
    *,
    overrides: Mapping[str, Any] | None = None,
    command: str | None = None,
) -> list[Path]:
    """``write_run``'s files and (when there are records) ``report.html`` in ``out_dir``;
    the files written. ``overrides`` are the run's preset overrides, for the capacities
    the report draws; ``command`` is shown in the report."""
    files = write_run(out_dir, summary, records)
    if records:
        files.append(out_dir / "report.html")
        write_report_of_run(files[-1], summary, records, overrides=overrides, command=command)
    return files

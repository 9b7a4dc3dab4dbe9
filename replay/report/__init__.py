"""The self-contained HTML report of a replay, a comparison or a sweep (inline SVG)."""

from __future__ import annotations

from replay.report.model import ClusterFacts, Report, ReportRun
from replay.report.render import render_report, write_report

__all__ = ["ClusterFacts", "Report", "ReportRun", "render_report", "write_report"]

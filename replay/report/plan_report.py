"""`replay plan`'s report.html: the tables the terminal shows (PDD's front, the verdict,
its sensitivity), cell for cell, with what each sensitivity row means.

The page reuses the replay report's stylesheet and Jinja environment; its own template
is ``templates/plan.html.j2``. Each table is the terminal's ``rich`` table read back
(``_table_of``), so the report and the terminal cannot disagree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from replay.experiments.plan import PlanResult
from replay.experiments.plan_output import (
    front_table,
    plan_warnings,
    sensitivity_table,
    verdict_lines,
    verdict_table,
)
from replay.report.render import environment

__all__ = ["SENSITIVITY_MEANINGS", "render_plan_report", "write_plan_report"]

SENSITIVITY_MEANINGS = (
    "line price xF: the line's price per Gbps-month scaled by F; H200 premium P: the "
    "H200 priced at the H100's price times 1 + P. Both reuse the confirmed capacities "
    "(capacity does not depend on prices).",
    "as confirmed, seed S alone: the confirmation's own figures for its first seed, the "
    "reference of the rows measured again below it.",
    "line RTT x2: the WAN's round trip doubled (and the line's delay of KV events with "
    "it); deployments without a line keep their reference.",
    "step costs x0.85 / x1.15: every engine pass of every pool 15% cheaper or dearer: "
    "what such an error in the simulator's step costs would change.",
    "hit rates flattened to 85-95%: the same requests, arrivals and lengths, each "
    "request's hit rate under an unbounded cache moved into the band (the PDD report's "
    "narrow case).",
)


def _text(cell: object) -> str:
    return cell if isinstance(cell, str) else str(cell)


def _table_of(table: Table, anchor: str, **extra: Any) -> dict[str, Any]:
    """A rich table's title, caption, headers and rows as text."""
    columns = table.columns
    cells = [[_text(c) for c in column.cells] for column in columns]
    rows = [list(row) for row in zip(*cells, strict=True)] if cells else []
    return {
        "id": anchor, "title": _text(table.title or ""), "caption": _text(table.caption or ""),
        "headers": [_text(c.header) for c in columns], "rows": rows, "lead": "", "lines": [],
        **extra,
    }  # fmt: skip


def _context(plan: PlanResult, command: str | None) -> dict[str, Any]:
    s = plan.settings
    tables = []
    if plan.best_of("pdd") is not None:
        tables.append(_table_of(front_table(plan), "front"))
    if plan.best:
        tables.append(_table_of(verdict_table(plan), "verdict", lines=verdict_lines(plan)))
    sensitivity = sensitivity_table(plan)
    if sensitivity is not None:
        lead = "How PDD's BCR over each baseline's moves with prices, the line's RTT, the "
        lead += "step costs and the trace's hit-rate skew."
        tables.append(
            _table_of(sensitivity, "sensitivity", lead=lead, lines=list(SENSITIVITY_MEANINGS))
        )
    return {
        "title": f"Deployment plan for {Path(s.trace).name}",
        "meta": [
            ("trace", s.trace),
            ("base preset", s.preset),
            ("policy", s.policy),
            ("target rate", f"{plan.target_rate_req_s:.3f} req/s"),
            ("seeds", ", ".join(str(x) for x in s.seeds)),
            ("deployments", f"{len(plan.results)}"),
        ],
        "command": command,
        "warnings": plan_warnings(plan),
        "tables": tables,
    }


def render_plan_report(plan: PlanResult, command: str | None = None) -> str:
    """The plan as one self-contained HTML document (the replay report's look)."""
    return environment().get_template("plan.html.j2").render(**_context(plan, command))


def write_plan_report(path: Path, plan: PlanResult, command: str | None = None) -> Path:
    """Write ``path`` (its folder is created) and return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_plan_report(plan, command), encoding="utf-8")
    return path

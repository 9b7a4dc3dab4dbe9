"""The report's load over time and cost split of one replay, from its summary.json."""

from __future__ import annotations

from typing import Any

import pytest
from replay_support import replay

from replay.report import load_cost
from replay.report.plots_time import timeline_figure
from replay.trace.synth import make_profile, synthesize


def test_a_cluster_in_one_datacenter_shows_no_line_and_prices_only_its_gpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    summary = replay(list(synthesize(make_profile("agentic"), 200, seed=1)), "idc-pd-small").summary
    drawn: list[tuple[Any, ...]] = []

    def drawing(*args: Any) -> Any:
        drawn.append(args)
        return timeline_figure(*args)

    monkeypatch.setattr(load_cost, "timeline_figure", drawing)
    load = load_cost.load_context(summary, None)
    assert load is not None
    ((_, utilization, _, wan, backlog),) = drawn
    assert wan is None
    assert backlog is None  # two panels: utilization and KV memory used
    assert set(utilization) == {"p", "md"}
    assert [name for name, _ in load["means"]] == [
        "utilization (busy time)",
        "KV memory used (mean)",
    ]
    assert "WAN backlog" not in load["figure"]
    rows = load_cost.cost_rows(summary)
    assert [r["part"] for r in rows] == ["p", "md", "cost"]
    assert sum(float(r["usd_h"]) for r in rows[:-1]) == pytest.approx(float(rows[-1]["usd_h"]))
    assert rows[-1]["usd_h"] == f"{summary.cost_per_hour:.2f}"
    shares = [float(r["share"].rstrip("%")) for r in rows[:-1]]
    assert shares == [
        pytest.approx(100 * summary.cost_split[k] / summary.cost_per_hour, abs=0.05)
        for k in ("p", "md")
    ]


def test_a_summary_without_a_timeline_has_no_load_section() -> None:
    summary = replay(list(synthesize(make_profile("agentic"), 50, seed=1)), "pdd-small")
    assert (
        load_cost.load_context(summary.summary.model_copy(update={"timeline": None}), 20.0) is None
    )

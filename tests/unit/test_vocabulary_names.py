"""Every replay command names the same quantity the same way, with its unit.

The names are collected from what the commands write and print, on two hand-made runs (no
simulation): summary.json, compare.json and compare.csv, sweep.json and probes.csv,
overload.json and overload.csv, plan.json's fields and plan.csv, tune's trials, and the
terminal tables of `replay run`, `demo`, `compare`, `sweep`, `overload`, `plan` and `tune`
and the report's. The README's words:

- capacity (req/s): an arrival rate, ``capacity_req_s``, "capacity (req/s)";
- SLA goodput (req/s): ``sla_goodput..._req_s``; a header says at which rate ("at capacity",
  "at the trace's rate") unless each row of its table gives its arrival rate;
- BCR (req/s per 1000 USD/h): ``bcr..._per_1000_usd_h``; one not at capacity says "at the
  trace's rate" in its field name and its header.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rich.table import Table

from cli.experiment_cmd import _print_capacity, _sweep_table
from cli.overload_cmd import OVERLOAD_HEADERS
from cli.tune_cmd import TUNE_HEADERS
from replay.experiments.capacity import (
    CapacityResult,
    CapacitySettings,
    WindowedAttainment,
    find_capacity,
)
from replay.experiments.compare import CompareResult, compare_results
from replay.experiments.compare_csv import COMPARE_COLUMNS
from replay.experiments.demo import DemoSetup, comparison_table
from replay.experiments.overload import COLUMNS as OVERLOAD_COLUMNS
from replay.experiments.overload import OverloadPoint, OverloadResult
from replay.experiments.plan_changes import Change, Remeasured
from replay.experiments.plan_output import (
    FRONT_HEADERS,
    PLAN_CSV_FIELDS,
    VERDICT_HEADERS,
    sensitivity_headers,
)
from replay.experiments.plan_verdict import Comparison, Sensitivity
from replay.experiments.policy_spec import parse_policy_spec
from replay.experiments.sweep import PROBE_COLUMNS, Probe, SweepResult
from replay.metrics.record import RequestRecord
from replay.metrics.summary import Summary, summarize
from replay.metrics.summary_inputs import ClusterFacts, RunSetup
from replay.metrics.table import summary_table
from replay.report.compare_table import compare_table
from replay.report.model import Report, ReportRun
from replay.report.page import _cards, table_rows
from replay.runner.run import ReplayResult
from replay.tuning.trial import Figures, Trial
from replay.tuning.tune import TRIAL_COLUMNS

TEMPLATE = Path(__file__).parents[2] / "replay" / "report" / "templates" / "report.html.j2"
AT_RATE = ("at capacity", "at the trace's rate")
BCR_UNIT = "(req/s per 1000 USD/h)"


# ---- two hand-made runs of the same 40 requests -------------------------------------


def _record(i: int, ttft_s: float) -> RequestRecord:
    return RequestRecord(
        request_id=i, session_id=None, arrival_s=0.5 * i, input_length=100,
        output_length=10, decided_pipeline="P-MD", pipeline="P-MD", reactive=False,
        handoff=None, handoff_rounds=0, eager_tokens=0, p_instance="p0", rld_instance=None,
        md_instance="md0", finished_on="md", ttft_s=ttft_s, ttft_prefill_s=ttft_s,
        tpot_s=0.02, max_gap_s=0.03, handoff_gap_s=None, e2e_s=ttft_s + 0.18,
        prefill_queue_s=0.0, prefill_s=0.1, hit_p=0.0, hit_rld=None, hit_md=0.5,
        predicted_hit_p=None, predicted_hit_md=None, predicted_wan_s=0.0, wan_bytes=1e6,
        transfer_s=0.01, tokens_rld=0, tokens_md=10, rld_busy_s=None, reason="test",
    )  # fmt: skip


def _result(policy: str, slow: float) -> ReplayResult:
    """TTFT P50 under a second and P99 over it: a table that scaled each row on its own
    would show the one in ms beside the other in s."""
    records = [_record(i, slow if i % 10 == 9 else 0.3 + 0.01 * i) for i in range(40)]
    setup = RunSetup(policy=policy, preset="hand", trace="hand.jsonl")
    return ReplayResult(summarize(records, setup, ClusterFacts(cost_per_hour=80.0)), records)


@pytest.fixture(scope="module")
def runs() -> list[ReplayResult]:
    return [_result("idc-pd", 3.0), _result("pdd", 2.5)]


@pytest.fixture(scope="module")
def compared(runs: list[ReplayResult]) -> CompareResult:
    specs = [parse_policy_spec("idc-pd"), parse_policy_spec("pdd")]
    return compare_results(specs, runs, resamples=20, seed=0)


def _steady() -> CapacityResult:
    def attainment(rate_req_s: float, seed: int) -> WindowedAttainment:
        return WindowedAttainment(met=(95 if rate_req_s <= 4.0 else 50,), total=(100,))

    return find_capacity(attainment, CapacitySettings(seeds=(0,), start_req_s=1.0))


def _sweep(summary: Summary, steady: CapacityResult | None) -> SweepResult:
    probe = Probe.of(summary, 0.5)
    return SweepResult(
        spec=parse_policy_spec("pdd"), target=0.5, tolerance=0.02, probes=[probe], best=probe,
        best_result=None, cost_per_hour=summary.cost_per_hour, bracketed=False, first=summary,
        steady=steady,
    )  # fmt: skip


# ---- what the commands write: field names -------------------------------------------


def _leaves(data: Any, prefix: str = "") -> Iterator[str]:
    """Every key of a JSON document (the last part of its path), lists walked through."""
    if isinstance(data, Mapping):
        for key, value in data.items():
            if key == "units":  # sweep.json's explanations, keyed by the fields above
                continue
            yield str(key)
            yield from _leaves(value, f"{prefix}{key}.")
    elif isinstance(data, list):
        for value in data:
            yield from _leaves(value, prefix)


def _field_names(runs: list[ReplayResult], compared: CompareResult) -> dict[str, set[str]]:
    summary = runs[1].summary
    sweep = _sweep(summary, _steady())
    overload = OverloadResult(
        spec=sweep.spec, sweep=sweep, points=[OverloadPoint.of(1.0, summary, 4.0)]
    )
    figures = Figures.of("hand", summary)
    trial = Trial.of(0, {}, [figures])
    return {
        "summary.json": set(_leaves(summary.model_dump(mode="json"))),
        "compare.json": set(_leaves(compared.to_json()))
        | {m["key"] for m in compared.to_json()["metrics"]},
        "compare.csv": set(COMPARE_COLUMNS),
        "sweep.json": set(_leaves(sweep.to_json())) | set(_leaves(_sweep(summary, None).to_json())),
        "probes.csv": set(PROBE_COLUMNS),
        "overload.json": set(_leaves(overload.to_json())),
        "overload.csv": set(OVERLOAD_COLUMNS),
        "plan.json": set(PLAN_CSV_FIELDS)
        | set(Comparison.model_fields)
        | set(Sensitivity.model_fields)
        | set(Remeasured.model_fields)
        | set(Change.model_fields)
        | set(CapacityResult.model_fields),
        "plan.csv": set(PLAN_CSV_FIELDS),
        "tune.json": set(_leaves(trial.model_dump(mode="json"))),
        "tune.trials.csv": set(TRIAL_COLUMNS),
    }


def _field_problem(name: str) -> str | None:
    """Why a field name breaks the vocabulary, or None."""
    if "goodput" in name:
        if not name.startswith(("sla_goodput", "pdd_sla_goodput", "baseline_sla_goodput")):
            return "goodput without sla_"
        if not name.endswith(("_req_s", "_kept", "_factor")):
            return "SLA goodput without its unit (_req_s)"
    bcr = "bcr" in name and not name.startswith("bcr_ratio")
    if bcr and not name.endswith("_per_1000_usd_h"):
        return "BCR without its unit (_per_1000_usd_h)"
    capacity = "capacity" in name and not name.startswith("sla_goodput_at_capacity")
    if capacity and name != "capacity" and not name.endswith("_req_s"):
        return "capacity without its unit (_req_s)"
    if name.endswith("_rps") and re.search("goodput|capacity|bcr|arrival", name):
        return "req/s spelled _rps: the vocabulary's unit is _req_s"
    return None


def test_every_written_field_names_its_quantity_and_unit(
    runs: list[ReplayResult], compared: CompareResult
) -> None:
    problems = [
        f"{where}: {name}: {why}"
        for where, names in _field_names(runs, compared).items()
        for name in sorted(names)
        if (why := _field_problem(name)) is not None
    ]
    assert problems == []


def test_a_bcr_not_at_capacity_says_so_in_its_field_name(
    runs: list[ReplayResult], compared: CompareResult
) -> None:
    """A run, a comparison and a tuning trial are at one rate, the trace's: their BCR is
    not the BCR at capacity and its name says so; sweep.json and plan.json hold the one at
    capacity, per 1000 USD/h (never per USD/h)."""
    names = _field_names(runs, compared)
    for where in ("summary.json", "compare.json", "tune.json", "tune.trials.csv"):
        bcr = {n for n in names[where] if "bcr" in n}
        assert bcr == {"bcr_at_trace_rate_per_1000_usd_h"}, where
    for where in ("sweep.json", "plan.json"):
        assert "bcr_per_1000_usd_h" in names[where]
        assert "bcr" not in names[where]
    summary = runs[1].summary
    assert summary.bcr_at_trace_rate_per_1000_usd_h == pytest.approx(
        summary.sla_goodput_req_s / 80.0 * 1000, rel=1e-6
    )


# ---- what the commands print: headers -----------------------------------------------


def _names(table: Table, *, by_row: bool = False) -> list[str]:
    """A table's headers, or (``by_row``: a row per quantity) its first column."""
    if by_row:
        return [str(cell).replace("\n", " ") for cell in table.columns[0].cells]
    return [str(c.header) for c in table.columns]


def _headers(runs: list[ReplayResult], compared: CompareResult) -> dict[str, list[str]]:
    summary = runs[1].summary
    setups = [DemoSetup(label=r.summary.policy, preset="hand", policy=r.summary.policy)
              for r in runs]  # fmt: skip
    demo = list(zip(setups, [r.summary for r in runs], strict=True))
    report = Report("run", [ReportRun("pdd", summary, runs[1].records)])
    report_cmp = Report(
        "compare", [ReportRun(r.summary.policy, r.summary, r.records) for r in runs],
        compare=compared,
    )  # fmt: skip
    th = re.findall(r"<th>([^<]*)</th>", TEMPLATE.read_text(encoding="utf-8"))
    return {
        "replay run": _names(summary_table(summary), by_row=True),
        "demo": _names(comparison_table(demo, "demo"), by_row=True),
        "replay compare": _names(compare_table(compared, all_metrics=True), by_row=True),
        "replay sweep": _names(_sweep_table(_sweep(summary, None))),
        "replay overload": list(OVERLOAD_HEADERS),
        "replay plan (front)": list(FRONT_HEADERS),
        "replay plan (verdict)": list(VERDICT_HEADERS),
        "replay plan (sensitivity)": sensitivity_headers(["intra-dc-pd", "colocated"]),
        "replay tune": list(TUNE_HEADERS),
        "report.html (run)": [f"{r['label']} ({r['unit']})" for r in table_rows(report)],
        "report.html (compare)": [f"{r['label']} ({r['unit']})" for r in table_rows(report_cmp)],
        "report.html (cards)": [label for c in _cards(report.runs) for label, _ in c["items"]],
        "report.html (sweep probes)": th,
    }


_UNIT = re.compile(r"\((s|ms)\)")


ONE_RATE = ("replay run", "demo", "replay compare", "replay tune", "report")
"""Tables of runs at one rate, the trace's: a BCR there is not the BCR at capacity."""


def _goodput_problem(h: str, rated: bool, cards: bool) -> str | None:
    if "goodput" not in h.lower():
        return None
    if "SLA goodput" not in h:
        return "goodput without SLA"
    if not rated and not any(q in h for q in AT_RATE):
        return "SLA goodput without the rate it is at"
    if not cards and "(req/s)" not in h and "(%)" not in h:
        return "SLA goodput without (req/s)"
    return None


def _bcr_problem(h: str, where: str, cards: bool) -> str | None:
    if "BCR" not in h or "ratio" in h:
        return None
    if not cards and BCR_UNIT not in h:
        return f"BCR without {BCR_UNIT}"
    if where.startswith(ONE_RATE) and "at the trace's rate" not in h:
        return "a BCR at the trace's rate that does not say so"
    return None


def _capacity_problem(h: str) -> str | None:
    if not re.search(r"\bcapacity\b", h) or h.startswith("x capacity"):
        return None
    if "SLA goodput" not in h and "(req/s)" not in h:
        return "capacity without (req/s)"
    return None


def _header_problems(where: str, headers: list[str]) -> Iterator[str]:
    rated = any("arrival rate" in h for h in headers)  # each row says its rate
    cards = "cards" in where  # a card's value carries its unit
    for h in headers:
        for why in (
            _goodput_problem(h, rated, cards), _bcr_problem(h, where, cards),
            _capacity_problem(h),
        ):  # fmt: skip
            if why is not None:
                yield f"{where}: {h!r}: {why}"
    figures = [h for h in headers if not h.startswith("SLA (")]  # not the SLA's thresholds
    for quantity in ("TTFT", "TPOT"):
        units = {m.group(1) for h in figures if quantity in h for m in _UNIT.finditer(h)}
        bare = [h for h in figures if quantity in h and not cards and not _UNIT.search(h)]
        if len(units) > 1:
            yield f"{where}: {quantity} in {sorted(units)} within one table"
        if bare:
            yield f"{where}: {bare}: {quantity} without its unit"


def test_every_table_names_each_quantity_the_same_way_with_its_unit(
    runs: list[ReplayResult], compared: CompareResult
) -> None:
    problems = [
        problem
        for where, headers in _headers(runs, compared).items()
        for problem in _header_problems(where, headers)
    ]
    assert problems == []


def test_the_same_quantity_has_the_same_header_in_every_table(
    runs: list[ReplayResult], compared: CompareResult
) -> None:
    """The canonical headers, word for word, wherever the quantity is a column."""
    headers = _headers(runs, compared)
    at_trace = "SLA goodput at the trace's rate (req/s)"
    bcr_trace = f"BCR at the trace's rate {BCR_UNIT}"
    for where in ("replay run", "demo", "replay compare", "replay tune", "report.html (run)"):
        assert at_trace in headers[where], where
        assert bcr_trace in headers[where], where
    for where in ("replay plan (front)", "replay plan (verdict)"):
        assert "capacity (req/s)" in headers[where]
        assert f"BCR {BCR_UNIT}" in headers[where]
    assert "SLA goodput at capacity (req/s)" in headers["replay plan (verdict)"]
    for where in ("replay sweep", "replay overload", "report.html (sweep probes)"):
        assert "arrival rate (req/s)" in headers[where]
        assert "SLA goodput (req/s)" in headers[where]


def test_a_sweep_prints_one_capacity_one_sla_goodput_at_capacity_and_one_bcr(
    runs: list[ReplayResult],
) -> None:
    """Capacity at steady state 4 req/s, 95% met there: SLA goodput at capacity 3.8 req/s,
    BCR 3.8 / 80 x 1000 = 47.5 req/s per 1000 USD/h, the one in sweep.json too."""
    sweep = _sweep(runs[1].summary, _steady())
    console = Console(record=True, width=200)
    _print_capacity(console, sweep)
    printed = console.export_text()
    assert "capacity at steady state: 4.000 req/s" in printed
    assert "SLA goodput at capacity: 3.800 req/s; BCR: 47.500 req/s per 1000 USD/h" in printed
    assert printed.count("BCR") == 1
    data = sweep.to_json()
    assert data["capacity_req_s"] == pytest.approx(4.0)
    assert data["sla_goodput_at_capacity_req_s"] == pytest.approx(3.8)
    assert data["bcr_per_1000_usd_h"] == pytest.approx(47.5)
    assert data["trace_timing_capacity_req_s"] == sweep.probes[0].arrival_rate_req_s


def test_the_readme_glossary_defines_each_word_once() -> None:
    """The words the tables use are defined in one place, the README's glossary, once each
    and with the unit the fields carry."""
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    glossary = readme.split("## Glossary", 1)[1].split("\n## ", 1)[0]
    terms = re.findall(r"^- \*\*([^*]+)\*\*", glossary, flags=re.MULTILINE)
    for word in ("PDD", "P", "RLD", "MD", "DRC", "Pipelines", "Handoff modes", "SLA",
                 "Capacity", "SLA goodput", "BCR"):  # fmt: skip
        assert terms.count(word) == 1, word
    entry = {t: glossary.split(f"- **{t}**", 1)[1].split("\n- **", 1)[0] for t in terms}
    assert "highest arrival rate" in entry["Capacity"]
    assert "`capacity_req_s`" in entry["Capacity"]
    assert "at a given arrival" in entry["SLA goodput"]
    assert "*at capacity*" in entry["SLA goodput"]
    assert "*at the trace's rate*" in entry["SLA goodput"]
    assert "req/s per 1000 USD/h" in entry["BCR"]
    assert "SLA goodput at capacity" in entry["BCR"]
    assert "`bcr_at_trace_rate_per_1000_usd_h`" in entry["BCR"]

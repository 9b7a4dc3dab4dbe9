"""What `replay plan` writes: plan.json, plan.csv, the best PDD deployment as a preset file,
and its tables (the PDD front, the verdict against each baseline, its sensitivity).

``plan.json`` (``plan_json``)::

    {"schema": "pdd-router/plan/4", "trace", "preset", "policy", "seeds", "sla", "target",
     "tolerance", "screen_tolerance", "window": {"warmup_s", "window_s", "windows",
     "tail_s"}, "screen_window": {...}, "trace_rate_req_s", "target_rate_req_s",
     "line_price_usd_per_gbps_month", "space": {...},
     "counts": {"candidates", "measured", "pruned": {"line": n, "dominated": n, ...}},
     "candidates": [{"family", "label", "preset", "policy", "overrides", "cost_usd_h",
                     "line_usd_h", "pdd": {p, rld, md, gpu_*, wan_gbps, params} | null,
                     "bounds": {"bound_req_s", "limit", "prefill_req_s", ...},
                     "limit_shown", "status", "pruned_by", "capacity_req_s",
                     "sla_goodput_at_capacity_req_s", "bcr_per_1000_usd_h", "feasible",
                     "on_front", "screen": capacity | null, "confirmed": capacity | null}],
     "front": [label, ...], "best": {family: label},
     "verdict": [comparison, ...], "sensitivity_seed": seed | null,
     "sensitivity": [{"change", "kind", "bcr_ratio": {baseline: ratio}, "seed",
                      "sla_goodput_at_capacity_req_s": {family: req/s},
                      "reused": [family, ...]}],
     "remeasured": [{"change": {"kind", "factor", "band"}, "text", "seed",
                     "capacity": {family: capacity}, "reused": [family, ...]}],
     "warnings": [text, ...]}

A capacity is ``CapacityResult`` (capacity and SLA goodput at capacity with their 95%
intervals, per-seed capacities, every probe, its warnings). ``limit_shown`` is the
tightest bound's resource when that bound is within 2x of the measured capacity, else
null: a bound further off says nothing of what limits the deployment.

A sensitivity row of ``kind`` price reuses the confirmed capacities (``seed`` null,
``sla_goodput_at_capacity_req_s`` empty); one of ``kind`` measured holds each family's
SLA goodput at capacity measured again under the change on ``seed`` alone (the first
row, "as confirmed", is that seed's figures in the confirmation: the reference),
``reused`` naming the families the change leaves as they are. ``remeasured`` holds those searches
whole. Schema 4 added ``kind``, ``seed``, ``sla_goodput_at_capacity_req_s``, ``reused``,
``sensitivity_seed`` and ``remeasured``.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from rich.table import Table

from replay.experiments.capacity import SHORT_TRACE
from replay.experiments.plan import CandidateResult, PlanResult
from replay.experiments.plan_edges import edge_warnings
from replay.experiments.plan_verdict import comparisons, sensitivity
from replay.presets.loader import load_preset

__all__ = [
    "front_table",
    "limit_shown",
    "plan_json",
    "plan_warnings",
    "printed_warnings",
    "sensitivity_headers",
    "sensitivity_table",
    "verdict_lines",
    "verdict_table",
    "write_plan",
]

SCHEMA = "pdd-router/plan/4"
LIMIT_WITHIN = 2.0  # a bound more than this many times the capacity is not named the limit

PLAN_CSV_FIELDS = (
    "family", "label", "cost_usd_h", "line_usd_h", "bound_req_s", "limit", "limit_shown",
    "status", "pruned_by", "capacity_req_s", "capacity_low_req_s", "capacity_high_req_s",
    "sla_goodput_at_capacity_req_s", "bcr_per_1000_usd_h", "feasible", "on_front",
)  # fmt: skip


def _finite(value: float) -> float | None:
    return round(value, 6) if math.isfinite(value) else None


def limit_shown(r: CandidateResult) -> str | None:
    """The bound's resource, when the bound is within ``LIMIT_WITHIN`` of the capacity."""
    if r.result is None or r.capacity_req_s <= 0:
        return r.bounds.limit if r.pruned_by not in (None, "dominated") else None
    return r.bounds.limit if r.bounds.rps <= LIMIT_WITHIN * r.capacity_req_s else None


def _candidate(plan: PlanResult, i: int) -> dict[str, Any]:
    r = plan.results[i]
    b = r.bounds
    d = r.deployment
    return {
        "family": r.family, "label": r.label, "preset": d.preset, "policy": d.policy,
        "overrides": d.overrides, "cost_usd_h": round(d.cost_usd_h, 6),
        "line_usd_h": round(d.line_usd_h, 6),
        "pdd": None if r.candidate is None else r.candidate.model_dump(mode="json"),
        "bounds": {
            "bound_req_s": _finite(b.rps), "limit": b.limit,
            "prefill_req_s": _finite(b.prefill_rps), "decode_req_s": _finite(b.decode_rps),
            "line_req_s": _finite(b.line_rps), "memory_ok": b.memory_ok,
        },
        "limit_shown": limit_shown(r), "status": r.status, "pruned_by": r.pruned_by,
        "capacity_req_s": r.capacity_req_s if r.result is not None else None,
        "sla_goodput_at_capacity_req_s": r.sla_goodput_req_s if r.result is not None else None,
        "bcr_per_1000_usd_h": round(r.bcr_per_1000_usd_h, 6) if r.result is not None else None,
        "feasible": plan.feasible(r), "on_front": i in plan.front,
        "screen": None if r.screen is None else r.screen.model_dump(mode="json"),
        "confirmed": None if r.confirmed is None else r.confirmed.model_dump(mode="json"),
    }  # fmt: skip


def plan_warnings(plan: PlanResult) -> list[str]:
    """PDD's best at an edge of the searched space, every confirmed search's warnings,
    then those of the searches under a change."""
    best = plan.best_of("pdd")
    out = (
        [] if best is None or best.candidate is None else edge_warnings(best.candidate, plan.space)
    )
    for r in plan.results:
        if r.confirmed is not None:
            out += [f"{r.label}: {w}" for w in r.confirmed.warnings]
    for m in plan.remeasured:
        for family, got in m.capacity.items():
            label = plan.results[plan.best[family]].label
            out += [f"{m.text}: {label}: {w}" for w in got.warnings]
    return out


def printed_warnings(warnings: Sequence[str]) -> list[str]:
    """The warnings as the terminal shows them: the short-trace warning, which every search
    of a short trace gives, once with how many gave it (plan.json keeps each)."""
    short = [w for w in warnings if SHORT_TRACE in w]
    out = [w for w in warnings if SHORT_TRACE not in w]
    if short:
        out.insert(0, f"{SHORT_TRACE} in {len(short)} of the plan's capacity searches: it was "
                      "tiled with fresh sessions (capacity assumes the trace's mix repeats; "
                      "each search's line is in plan.json's warnings)")  # fmt: skip
    return out


def plan_json(plan: PlanResult) -> dict[str, Any]:
    s = plan.settings
    return {
        "schema": SCHEMA, "trace": s.trace, "preset": s.preset, "policy": s.policy,
        "seeds": list(s.seeds), "sla": s.sla.model_dump(mode="json"), "target": s.target,
        "tolerance": s.tolerance, "screen_tolerance": s.screen_tolerance,
        "window": s.window.model_dump(mode="json"),
        "screen_window": s.screen_window.model_dump(mode="json"),
        "trace_rate_req_s": round(plan.trace_rate_req_s, 6),
        "target_rate_req_s": round(plan.target_rate_req_s, 6),
        "line_price_usd_per_gbps_month": plan.space.wan_price_per_gbps_month,
        "space": plan.space.model_dump(mode="json"),
        "counts": {
            "candidates": len(plan.results),
            "measured": sum(r.status != "pruned" for r in plan.results),
            "pruned": plan.pruned_by(),
        },
        "candidates": [_candidate(plan, i) for i in range(len(plan.results))],
        "front": [plan.results[i].label for i in plan.front],
        "best": {f: plan.results[i].label for f, i in plan.best.items()},
        "verdict": [c.model_dump(mode="json") for c in comparisons(plan)],
        "sensitivity_seed": plan.remeasured[0].seed if plan.remeasured else None,
        "sensitivity": [x.model_dump(mode="json") for x in sensitivity(plan)],
        "remeasured": [m.model_dump(mode="json") for m in plan.remeasured],
        "warnings": plan_warnings(plan),
    }  # fmt: skip


def _csv_row(row: dict[str, Any]) -> dict[str, Any]:
    flat = {k: row[k] for k in PLAN_CSV_FIELDS if k in row}
    flat["bound_req_s"] = row["bounds"]["bound_req_s"]
    flat["limit"] = row["bounds"]["limit"]
    got = row["confirmed"] or row["screen"]
    flat["capacity_low_req_s"] = None if got is None else got["capacity_low_req_s"]
    flat["capacity_high_req_s"] = None if got is None else got["capacity_high_req_s"]
    return flat


def write_best_preset(plan: PlanResult, path: Path) -> None:
    """PDD's best deployment as a preset file ``replay run --preset FILE`` replays."""
    r = plan.best_of("pdd")
    assert r is not None
    assert r.candidate is not None
    s = plan.settings
    overrides = {**r.deployment.overrides, "default_policy": s.policy}
    tree = load_preset(s.preset, overrides).resolved()
    name = Path(s.trace).name
    tree["description"] = f"replay plan's best PDD deployment for {name}: {r.label}"
    header = (
        f"# pdd-router replay plan: best BCR on {name}, capacity {r.capacity_req_s:.3f} "
        f"req/s at {r.cost_usd_h:.2f} USD/h\n"
        f"# replay it: pdd-router replay run TRACE --preset {path.name} "
        f"--policy '{r.deployment.policy}'\n"
    )
    path.write_text(header + yaml.safe_dump(tree, sort_keys=False, width=88), encoding="utf-8")


def write_plan(plan: PlanResult, out: Path) -> list[Path]:
    """plan.json, plan.csv and (when a PDD deployment met the target) best-preset.yaml."""
    out.mkdir(parents=True, exist_ok=True)
    data = plan_json(plan)
    written = [out / "plan.json", out / "plan.csv"]
    written[0].write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    with written[1].open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(PLAN_CSV_FIELDS))
        writer.writeheader()
        for row in data["candidates"]:
            writer.writerow(_csv_row(row))
    if plan.best_of("pdd") is not None:
        written.append(out / "best-preset.yaml")
        write_best_preset(plan, written[-1])
    return written


def _interval(r: CandidateResult) -> str:
    c = r.confirmed
    return "" if c is None else f" [{c.capacity_low_req_s:.2f}, {c.capacity_high_req_s:.2f}]"


FRONT_HEADERS = (
    "cost (USD/h)", "capacity (req/s)", "BCR (req/s per 1000 USD/h)", "P", "RLD", "MD",
    "WAN (Gbps)", "limit",
)  # fmt: skip
VERDICT_HEADERS = (
    "family", "cost (USD/h)", "capacity (req/s)", "SLA goodput at capacity (req/s)",
    "BCR (req/s per 1000 USD/h)", "BCR ratio", "factors",
)  # fmt: skip


def _widest(header: str) -> int:
    """A header's longest word: the column never narrower, so no word is cut."""
    return max(len(word) for word in header.split())


def front_table(plan: PlanResult) -> Table:
    """PDD's Pareto front on the screening's figures, cheapest first (fits 80 columns)."""
    table = Table(
        title="PDD: cost against capacity (screened)",
        caption="capacity: the highest arrival rate at which the target share meets the SLA "
        "(steady state, screened: one seed, a short window, a loose tolerance); BCR: SLA "
        "goodput at capacity per 1000 USD/h; * best BCR "
        "(confirmed in the verdict); limit: the tightest bound, when within 2x of the capacity",
    )
    for name in FRONT_HEADERS:
        table.add_column(
            name, justify="right" if name != "limit" else "left", min_width=_widest(name)
        )
    best = plan.best.get("pdd")
    for i in plan.front:
        r = plan.results[i]
        c = r.candidate
        assert c is not None
        table.add_row(
            f"{r.cost_usd_h:.2f}", f"{r.screened_req_s:.2f}",
            f"{r.screened_bcr_per_1000_usd_h:.1f}" + ("*" if i == best else ""),
            f"{c.p}x{c.gpu_p}", f"{c.rld}x{c.gpu_rld}", f"{c.md}x{c.gpu_md}",
            f"{c.wan_gbps:g}", limit_shown(r) or "-",
        )  # fmt: skip
    return table


FAMILY_NAMES = {"pdd": "PDD", "intra-dc-pd": "intra-DC PD", "colocated": "colocated"}


def verdict_table(plan: PlanResult) -> Table:
    """Each family's confirmed best, and PDD's BCR over it with the factors (80 columns)."""
    table = Table(
        title="Verdict: each family's best within the same budget range (confirmed)",
        caption="confirmed: measured again on every seed, the full window, to the tolerance; "
        "[95%] intervals; BCR ratio: PDD's BCR over the row's = SLA goodput x "
        "hardware x line factors",
    )
    for name in VERDICT_HEADERS:
        width = len("colocated") if name == "family" else _widest(name)
        table.add_column(
            name, justify="left" if name in ("family", "factors") else "right", min_width=width
        )
    by_family = {c.baseline: c for c in comparisons(plan)}
    for family, i in plan.best.items():
        r = plan.results[i]
        got = r.confirmed
        c = by_family.get(family)
        ratio = (
            ""
            if c is None
            else f"{c.bcr_ratio:.2f} [{c.bcr_ratio_low:.2f}, {c.bcr_ratio_high:.2f}]"
        )
        factors = (
            "" if c is None
            else f"{c.sla_goodput_factor:.2f} x {c.hardware_factor:.2f} x {c.line_factor:.2f}"
        )  # fmt: skip
        table.add_row(
            FAMILY_NAMES.get(family, family), f"{r.cost_usd_h:.2f}",
            f"{r.capacity_req_s:.2f}" + _interval(r),
            f"{r.sla_goodput_req_s:.2f}" + ("" if got is None else
                f" [{got.sla_goodput_low_req_s:.2f}, {got.sla_goodput_high_req_s:.2f}]"),
            f"{r.bcr_per_1000_usd_h:.1f}", ratio, factors,
        )  # fmt: skip
    return table


def sensitivity_headers(families: list[str]) -> list[str]:
    """The sensitivity table's headers: the change, a BCR ratio per baseline family, PDD's
    SLA goodput at capacity."""
    ratios = [f"BCR ratio vs {FAMILY_NAMES[f]}" for f in families]
    return ["change", *ratios, "PDD's SLA goodput at capacity (req/s)"]


def sensitivity_table(plan: PlanResult) -> Table | None:
    """The verdict's BCR ratios under each change, and PDD's SLA goodput where measured
    again (None without a verdict)."""
    rows = sensitivity(plan)
    if not rows:
        return None
    families = [f for f in ("intra-dc-pd", "colocated") if any(f in r.bcr_ratio for r in rows)]
    seed = plan.remeasured[0].seed if plan.remeasured else None
    caption = "BCR ratio: PDD's BCR over the family's best's; price rows reuse the confirmed "
    caption += "capacities"
    if seed is not None:
        caption += (
            f"; measured rows: each family's best measured again on seed {seed} alone, read "
            "against the 'as confirmed' row (that seed's own figures)"
        )
    table = Table(title="Sensitivity of the verdict", caption=caption)
    headers = sensitivity_headers(families)
    for k, name in enumerate(headers):
        table.add_column(name, justify="right" if k else "left", min_width=_widest(name))
    for r in rows:
        good = r.sla_goodput_at_capacity_req_s.get("pdd")
        table.add_row(
            r.change, *(f"{r.bcr_ratio[f]:.2f}" if f in r.bcr_ratio else "-" for f in families),
            "" if good is None else f"{good:.2f}",
        )  # fmt: skip
    return table


def verdict_lines(plan: PlanResult) -> list[str]:
    """The deployment behind each row of the verdict table."""
    return [
        f"{FAMILY_NAMES.get(f, f)}: {plan.results[i].label.split(': ', 1)[-1]}"
        for f, i in plan.best.items()
    ]

"""What `replay plan` writes: plan.json, plan.csv, the best deployment as a preset file,
and the Pareto front as a table.

``plan.json`` (``plan_json``)::

    {"schema": "pdd-router/plan/1", "trace", "preset", "policy", "seed", "sla", "target",
     "trace_rate_rps", "target_rate_rps", "line_price_per_gbps_month", "space": {...},
     "counts": {"candidates", "evaluated", "pruned": {"line": n, "dominated": n, ...}},
     "candidates": [{"label", "p", "rld", "md", "gpu_p", "gpu_rld", "gpu_md", "wan_gbps",
                     "params", "cost_per_hour", "bounds": {...}, "status", "pruned_by",
                     "sla_goodput_rps", "bcr", "feasible", "on_front", "sweep": {...}}],
     "front": [label, ...], "best": label | null,
     "baseline": {"preset", "policy", "p", "md", "cost_per_hour", "sla_goodput_rps",
                  "bcr", ...} | null,
     "bcr_ratio": best BCR / baseline BCR | null}

BCR is SLA goodput (req/s) per USD/h in the files; the table shows it per 1000 USD/h.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import yaml
from rich.table import Table

from replay.experiments.plan import Baseline, CandidateResult, PlanResult
from replay.presets.loader import load_preset

__all__ = ["bcr_ratio", "front_table", "plan_json", "write_best_preset", "write_plan"]

SCHEMA = "pdd-router/plan/1"

_CSV_FIELDS = (
    "label", "p", "rld", "md", "gpu_p", "gpu_rld", "gpu_md", "wan_gbps", "params",
    "cost_per_hour", "bound_rps", "limit", "prefill_bound_rps", "decode_bound_rps",
    "line_bound_rps", "status", "pruned_by", "sla_goodput_rps", "bcr", "feasible", "on_front",
)  # fmt: skip


def _finite(value: float) -> float | None:
    return round(value, 6) if math.isfinite(value) else None


def _bounds(r: CandidateResult | Baseline) -> dict[str, Any]:
    b = r.bounds
    return {
        "rps": _finite(b.rps), "limit": b.limit, "prefill_rps": _finite(b.prefill_rps),
        "decode_rps": _finite(b.decode_rps), "line_rps": _finite(b.line_rps),
        "memory_ok": b.memory_ok,
    }  # fmt: skip


def _candidate(plan: PlanResult, i: int) -> dict[str, Any]:
    r = plan.results[i]
    return {
        "label": r.candidate.label,
        **r.candidate.model_dump(mode="json"),
        "cost_per_hour": round(r.cost_per_hour, 6),
        "bounds": _bounds(r),
        "status": r.status,
        "pruned_by": r.pruned_by,
        "sla_goodput_rps": r.goodput_rps if r.outcome is not None else None,
        "bcr": round(r.bcr, 9) if r.outcome is not None else None,
        "feasible": plan.feasible(r),
        "on_front": i in plan.front,
        "sweep": None if r.outcome is None else r.outcome.model_dump(mode="json"),
    }


def bcr_ratio(plan: PlanResult) -> float | None:
    """The best deployment's BCR over the baseline's (None without both)."""
    if plan.best is None or plan.baseline is None or plan.baseline.bcr <= 0:
        return None
    return plan.results[plan.best].bcr / plan.baseline.bcr


def plan_json(plan: PlanResult) -> dict[str, Any]:
    s = plan.settings
    base = plan.baseline
    return {
        "schema": SCHEMA,
        "trace": s.trace,
        "preset": s.preset,
        "policy": s.policy,
        "seed": s.seed,
        "sla": s.sla.model_dump(mode="json"),
        "target": s.target,
        "trace_rate_rps": round(plan.trace_rate_rps, 6),
        "target_rate_rps": round(plan.target_rate_rps, 6),
        "line_price_per_gbps_month": plan.space.wan_price_per_gbps_month,
        "space": plan.space.model_dump(mode="json"),
        "counts": {
            "candidates": len(plan.results),
            "evaluated": sum(r.status == "evaluated" for r in plan.results),
            "pruned": plan.pruned_by(),
        },
        "candidates": [_candidate(plan, i) for i in range(len(plan.results))],
        "front": [plan.results[i].candidate.label for i in plan.front],
        "best": None if plan.best is None else plan.results[plan.best].candidate.label,
        "baseline": None if base is None else {
            "preset": base.preset, "policy": base.policy, "p": base.p, "md": base.md,
            "overrides": base.overrides, "cost_per_hour": round(base.cost_per_hour, 6),
            "bounds": _bounds(base), "sla_goodput_rps": base.outcome.sla_goodput_rps,
            "bcr": round(base.bcr, 9), "sweep": base.outcome.model_dump(mode="json"),
        },
        "bcr_ratio": bcr_ratio(plan),
    }  # fmt: skip


def _csv_row(row: dict[str, Any]) -> dict[str, Any]:
    b = row["bounds"]
    flat = {k: row[k] for k in _CSV_FIELDS if k in row}
    flat["params"] = ";".join(f"{k}={v}" for k, v in sorted(row["params"].items()))
    flat.update(
        bound_rps=b["rps"], limit=b["limit"], prefill_bound_rps=b["prefill_rps"],
        decode_bound_rps=b["decode_rps"], line_bound_rps=b["line_rps"],
    )  # fmt: skip
    return flat


def write_best_preset(plan: PlanResult, path: Path) -> None:
    """The best deployment as a preset file ``replay run --preset FILE`` replays."""
    assert plan.best is not None
    r = plan.results[plan.best]
    s = plan.settings
    overrides = {**r.overrides, "default_policy": s.policy}
    tree = load_preset(s.preset, overrides).resolved()
    name = Path(s.trace).name
    tree["description"] = f"replay plan's best deployment for {name}: {r.candidate.label}"
    params = ",".join(f"{k}={v}" for k, v in sorted(r.candidate.params.items()))
    policy = f"{s.policy}:{params}" if params else s.policy
    header = (
        f"# pdd-router replay plan: best BCR on {Path(s.trace).name}, SLA goodput "
        f"{r.goodput_rps:.3f} req/s at {r.cost_per_hour:.2f} USD/h\n"
        f"# replay it: pdd-router replay run TRACE --preset {path.name} --policy '{policy}'\n"
    )
    path.write_text(header + yaml.safe_dump(tree, sort_keys=False, width=88), encoding="utf-8")


def write_plan(plan: PlanResult, out: Path) -> list[Path]:
    """plan.json, plan.csv and (when a candidate met the target) best-preset.yaml."""
    out.mkdir(parents=True, exist_ok=True)
    data = plan_json(plan)
    written = [out / "plan.json", out / "plan.csv"]
    written[0].write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    with written[1].open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(_CSV_FIELDS))
        writer.writeheader()
        for row in data["candidates"]:
            writer.writerow(_csv_row(row))
    if plan.best is not None:
        written.append(out / "best-preset.yaml")
        write_best_preset(plan, written[-1])
    return written


def front_table(plan: PlanResult) -> Table:
    """The Pareto front, cheapest first (fits 80 columns)."""
    table = Table(
        title="Pareto front: cost against SLA goodput",
        caption="BCR: SLA goodput per 1000 USD/h; limit: the tightest bound; * best BCR",
    )
    for name in ("USD/h", "req/s", "BCR", "P", "RLD", "MD", "Gbps", "limit"):
        table.add_column(name, justify="right" if name != "limit" else "left")
    for i in plan.front:
        r = plan.results[i]
        c = r.candidate
        mark = "*" if i == plan.best else ""
        table.add_row(
            f"{r.cost_per_hour:.2f}", f"{r.goodput_rps:.2f}", f"{r.bcr * 1000:.1f}{mark}",
            f"{c.p}x{c.gpu_p}", f"{c.rld}x{c.gpu_rld}", f"{c.md}x{c.gpu_md}",
            f"{c.wan_gbps:g}", r.bounds.limit,
        )  # fmt: skip
    return table

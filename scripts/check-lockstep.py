#!/usr/bin/env python3
"""Check the lockstep hypothesis for the replay's TTFT error on published SGLang runs.

For each single-engine run of the engine (default: sglang) in the shipped set, the mean
TTFT, TPOT and end-to-end latency of a lockstep round (``replay.experiments
.published_lockstep``: the engine's defaults, the database's step costs, nothing
fitted) against the measured ones; per engine, model, GPU and engine version, the median
absolute relative error and the shares within 15% / 25%. With ``--replayed
validate-costs.json`` (written by `pdd-router replay validate-costs`), the replay's
errors on the same runs beside them.

    PYTHONPATH=. python scripts/check-lockstep.py --replayed validate-costs-out/validate-costs.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from replay.experiments.published import PublishedRun, published_preset, read_published
from replay.experiments.published_check import METRICS, summarize_errors
from replay.experiments.published_lockstep import lockstep_means
from replay.sim.step_costs import resolve_step_costs


def _errors(run: PublishedRun, ttft_ms: float, tpot_ms: float) -> dict[str, float]:
    e2e = ttft_ms + (run.osl - 1) * tpot_ms
    measured_e2e = run.ttft_ms + (run.osl - 1) * run.tpot_ms
    return {
        "ttft": (ttft_ms - run.ttft_ms) / run.ttft_ms,
        "tpot": (tpot_ms - run.tpot_ms) / run.tpot_ms,
        "e2e": (e2e - measured_e2e) / measured_e2e,
    }


def _cell(errors: list[float]) -> str:
    s = summarize_errors(errors)
    return f"{100 * s.median_abs_error:.0f}% ({100 * s.within_15:.0f}% / {100 * s.within_25:.0f}%)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="sglang", choices=("vllm", "sglang", "trtllm"))
    parser.add_argument("--replayed", type=Path, help="validate-costs.json to compare with")
    args = parser.parse_args()
    replayed: dict[str, dict[str, float]] = {}
    if args.replayed is not None:
        report = json.loads(args.replayed.read_text(encoding="utf-8"))
        replayed = {r["run"]["id"]: r["errors"]["perfdb"] for r in report["runs"]
                    if "perfdb" in r["errors"]}  # fmt: skip
    groups: dict[str, dict[str, list[dict[str, float]]]] = {}
    for run in read_published():
        if run.mode != "agg" or run.engine != args.engine:
            continue
        costs = resolve_step_costs(published_preset(run, "perfdb"), "engines").costs
        means = lockstep_means(run, costs)
        version = run.engine_version or "(version not recorded)"
        name = f"{run.engine} {version}/{run.model}/{run.hardware}"
        group = groups.setdefault(name, {"lockstep": [], "replay": []})
        group["lockstep"].append(_errors(run, means.ttft_ms, means.tpot_ms))
        if run.id in replayed:
            group["replay"].append(replayed[run.id])
    print("set | runs | model | " + " | ".join(f"{m} mean" for m in METRICS))
    for name, group in groups.items():
        for model, items in group.items():
            if items:
                cells = [_cell([i[m] for i in items]) for m in METRICS]
                print(f"{name} | {len(items)} | {model} | " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())

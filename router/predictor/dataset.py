"""Decision logs joined with their outcomes: the predictor's training and test rows.

One row per (decision, tier) whose outcome reports a realized hit on the instance the
decision chose: the features logged for that instance, the realized hit, and the two
baselines on the same row (the raw index match, and the match in the router's own
record of its routes, which is what approximate mode sees). Rows keep their decision
time so that splits are by time, never shuffled.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from router.errors import UserError
from router.predictor.features import FEATURES, FloatArray

__all__ = ["Dataset", "read_logs"]

Advance = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class Dataset:
    """Joined rows; ``X`` columns follow ``features``."""

    X: FloatArray
    y: FloatArray
    tier: npt.NDArray[np.str_]
    t: FloatArray
    raw: FloatArray  # index match (match_frac)
    approx: FloatArray  # router's own record (route_frac)
    log: npt.NDArray[np.int64]  # which log file the row came from
    index_mode: npt.NDArray[np.str_]
    features: tuple[str, ...] = FEATURES

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, mask: npt.NDArray[np.bool_]) -> Dataset:
        return Dataset(
            self.X[mask],
            self.y[mask],
            self.tier[mask],
            self.t[mask],
            self.raw[mask],
            self.approx[mask],
            self.log[mask],
            self.index_mode[mask],
            self.features,
        )

    def split(self, train_fraction: float) -> tuple[Dataset, Dataset]:
        """(earlier, later): in each log, the first ``train_fraction`` of rows by time."""
        if not 0.0 <= train_fraction <= 1.0:
            raise UserError(f"--split must be within [0, 1], got {train_fraction}")
        early = np.zeros(len(self), dtype=bool)
        for log in np.unique(self.log):
            rows = np.flatnonzero(self.log == log)
            order = rows[np.argsort(self.t[rows], kind="stable")]
            early[order[: math.floor(train_fraction * len(order))]] = True
        return self.subset(early), self.subset(~early)


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise UserError(f"{path}: no such decision log")
    out: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise UserError(f"{path}:{number}: not a JSON line") from None
            if not isinstance(record, dict):
                raise UserError(f"{path}:{number}: not a decision-log record")
            out.append(record)
    return out


def _join(records: list[dict[str, Any]], log: int, rows: list[tuple[Any, ...]]) -> None:
    outcomes = {r["id"]: r for r in records if r.get("kind") == "outcome" and "id" in r}
    # a request decided again (the live service's failover) is joined by its last decision
    decisions = {r.get("id"): r for r in records if r.get("kind") == "decision" and "features" in r}
    for record in decisions.values():
        outcome = outcomes.get(record.get("id"))
        if outcome is None:
            continue
        chosen = outcome.get("instances", {})
        for tier, hit in outcome.get("realized_hit", {}).items():
            logged = record["features"].get(tier)
            if logged is None or hit is None or logged.get("instance") != chosen.get(tier):
                continue
            x = [math.nan if logged.get(f) is None else float(logged[f]) for f in FEATURES]
            mode = record.get("index_mode", "events")
            rows.append((x, float(hit), tier, float(record.get("t", 0.0)), log, mode))


def read_logs(paths: Sequence[Path], advance: Advance | None = None) -> Dataset:
    """Join every log's decisions with its outcomes; a UserError when nothing joins."""
    if not paths:
        raise UserError("give at least one decision log")
    rows: list[tuple[Any, ...]] = []
    for log, path in enumerate(paths):
        before = len(rows)
        records = _lines(path)
        _join(records, log, rows)
        if len(rows) == before:
            has_decisions = any(r.get("kind") == "decision" for r in records)
            why = (
                "its decisions have no outcome lines"
                if has_decisions
                else "it holds no decision with features (write one with "
                "`pdd-router replay run --decision-log FILE`, or from `pdd-router serve` "
                "with PDD_ROUTER_SERVICE__DECISION_LOG=FILE)"
            )
            raise UserError(f"{path}: nothing to learn from: {why}")
        if advance is not None:
            advance(log + 1)
    x = np.array([r[0] for r in rows], dtype=np.float64).reshape(len(rows), len(FEATURES))
    raw = x[:, FEATURES.index("match_frac")]
    approx = x[:, FEATURES.index("route_frac")]
    return Dataset(
        X=x,
        y=np.array([r[1] for r in rows], dtype=np.float64),
        tier=np.array([r[2] for r in rows], dtype=np.str_),
        t=np.array([r[3] for r in rows], dtype=np.float64),
        raw=raw.copy(),
        approx=approx.copy(),
        log=np.array([r[4] for r in rows], dtype=np.int64),
        index_mode=np.array([r[5] for r in rows], dtype=np.str_),
    )

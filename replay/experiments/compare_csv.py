"""``compare.csv``: compare.json's metrics as one row per metric and policy.

Long rather than wide, so a spreadsheet filters one metric (its policies one under
the other) or pivots it without parsing column names; the units are compare.json's
(``unit``: ``s`` seconds, ``share`` a fraction 0-1, ``B`` bytes, ``req/s per 1000 USD/h``),
not the printed table's. The baseline's row has no difference; a row's interval is
empty when its metric has none (``method`` empty, see ``compare_stats``).
"""

from __future__ import annotations

import csv
from pathlib import Path

from replay.experiments.compare import CompareResult

__all__ = ["COMPARE_COLUMNS", "compare_csv_rows", "write_compare_csv"]

COMPARE_COLUMNS = (
    "metric", "label", "unit", "better", "method", "policy", "baseline", "value",
    "difference", "relative", "ci_low", "ci_high", "significant",
)  # fmt: skip
"""``metric`` is compare.json's key (a dotted path into summary.json), ``policy`` the
policy's label; ``difference`` = value - the baseline's value, ``relative`` = difference
/ |baseline's value|, ``ci_low``/``ci_high`` its 95% interval, ``significant`` whether
the interval excludes 0."""

Cell = float | str | bool


def _cell(value: float | bool | str | None) -> Cell:
    return "" if value is None else value


def compare_csv_rows(result: CompareResult) -> list[list[Cell]]:
    """The rows of compare.csv, without its header, in compare.json's order."""
    labels = result.labels
    rows: list[list[Cell]] = []
    for row in result.rows:
        spec = row.spec
        head: list[Cell] = [spec.key, spec.label, spec.unit, _cell(spec.better), _cell(spec.method)]
        for i, (label, value) in enumerate(zip(labels, row.values, strict=True)):
            tail: list[Cell] = ["", "", "", "", ""]
            if i:
                d = row.differences[i - 1]
                low, high = (None, None) if d.ci is None else (d.ci.low, d.ci.high)
                tail = [
                    _cell(d.difference), _cell(d.relative),
                    "" if low is None else round(low, 9), "" if high is None else round(high, 9),
                    _cell(d.significant),
                ]  # fmt: skip
            rows.append([*head, label, i == 0, _cell(value), *tail])
    return rows


def write_compare_csv(path: Path, result: CompareResult) -> Path:
    """Write ``path`` (its folder is created) and return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(COMPARE_COLUMNS)
        writer.writerows(compare_csv_rows(result))
    return path

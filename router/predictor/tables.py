"""Rich tables of a predictor evaluation: MAE against the baselines, buckets, calibration."""

from __future__ import annotations

from rich.table import Table

from router.predictor.evaluate import MODEL, RAW, Evaluation

__all__ = ["bucket_table", "calibration_table", "summary_table"]


def _f(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def summary_table(ev: Evaluation, title: str) -> Table:
    """One row per predictor: MAE overall and per tier, calibration error, and its MAE's
    change against the index match (negative: a lower error; the bias is in the JSON
    output)."""
    tiers = sorted(ev.by_tier_rows)
    rows = ", ".join(f"{t} {ev.by_tier_rows[t]}" for t in tiers)
    table = Table(title=title, caption=f"MAE per tier; rows: {rows}; cal.: calibration error")
    table.add_column("predictor", style="bold", min_width=11)
    for name in ("MAE", *tiers, "cal."):
        table.add_column(name, justify="right", no_wrap=True, min_width=6)
    table.add_column("MAE vs index", justify="right", no_wrap=True, min_width=8)
    base = ev.scores[RAW].mae if RAW in ev.scores else None
    for name, s in ev.scores.items():
        gain = "-" if not base else f"{(s.mae / base - 1) * 100:+.1f}%"
        table.add_row(
            name,
            _f(s.mae),
            *(_f(s.by_tier.get(t)) for t in tiers),
            _f(s.calibration_error),
            gain,
        )
    return table


def bucket_table(ev: Evaluation) -> Table:
    """MAE of each predictor by realized-hit bucket."""
    table = Table(title="MAE by realized hit rate")
    table.add_column("realized hit", style="bold")
    table.add_column("rows", justify="right")
    names = list(ev.scores)
    for name in names:
        table.add_column(name, justify="right")
    first = ev.scores[names[0]]
    for i, bucket in enumerate(first.by_bucket):
        table.add_row(
            bucket.bucket,
            str(bucket.rows),
            *(_f(ev.scores[n].by_bucket[i].mae) for n in names),
        )
    return table


def calibration_table(ev: Evaluation, name: str = MODEL) -> Table:
    """Mean realized hit against mean prediction in bins of the prediction."""
    table = Table(title=f"calibration of the {name}")
    table.add_column("predicted", style="bold")
    table.add_column("rows", justify="right")
    table.add_column("mean predicted", justify="right")
    table.add_column("mean realized", justify="right")
    for b in ev.scores[name].calibration:
        if b.rows:
            table.add_row(f"{b.low:.1f}-{b.high:.1f}", str(b.rows), _f(b.predicted), _f(b.realized))
    return table

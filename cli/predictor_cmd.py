"""`pdd-router predictor ...`: train and evaluate the hit-rate model on decision logs.

Decision logs come from `pdd-router replay run --decision-log FILE` (or the live
service): one line per decision, one per outcome. scikit-learn is imported only when
a command runs, so ``--help`` stays instant.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

if TYPE_CHECKING:
    from router.predictor.dataset import Dataset

__all__ = ["predictor_app"]

predictor_app = typer.Typer(
    help="Hit-rate predictor: train on decision logs, evaluate against the raw index match.",
    no_args_is_help=True,
)

_LOGS = typer.Argument(
    ...,
    help="Decision logs (replay run --decision-log, or serve's service.decision_log), oldest first",
)
_SPLIT_HELP = "Share of each log (by time, never shuffled) that is training data"


@contextmanager
def _status(enabled: bool, message: str) -> Iterator[None]:
    """A spinner on stderr when it is a terminal and progress is wanted."""
    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield
        return
    with console.status(message):
        yield


def _read(logs: list[Path], progress: bool) -> Dataset:
    from router.predictor.dataset import read_logs

    with _status(progress, f"reading {len(logs)} decision log(s)"):
        return read_logs(logs)


@predictor_app.command("train")
def train(
    logs: list[Path] = _LOGS,
    out: Path = typer.Option(..., "--out", help="Model file to write (skops)"),
    split: float = typer.Option(0.7, "--split", help=_SPLIT_HELP),
    param: list[str] = typer.Option(
        [],
        "--param",
        metavar="KEY=VALUE",
        help="Model parameter, e.g. n_estimators=300 or fallback_features=[match_frac]",
    ),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress display"),
) -> None:
    """Fit the hit-rate model on the earlier part of LOGs and save it with skops."""
    from replay.presets.loader import parse_overrides
    from router.predictor.train import train_and_save

    data = _read(logs, not no_progress)
    with _status(not no_progress, f"fitting on {len(data)} rows"):
        params = parse_overrides(param)
        report = train_and_save(data, logs, out, train_fraction=split, params=params)
    tiers = ", ".join(f"{t} {n}" for t, n in report.by_tier.items())
    kept = ", ".join(report.model_tiers) or "none"
    others = "".join(f"; {t} predicts {f}" for t, f in report.fallbacks.items())
    Console().print(
        f"trained on {report.train_rows} of {report.rows} rows ({tiers}; index mode "
        f"{', '.join(report.index_modes)}); model kept for tiers: {kept}{others}; wrote {out}",
        highlight=False,
        soft_wrap=True,
    )


@predictor_app.command("eval")
def evaluate(
    model: Path = typer.Argument(..., help="Model file (predictor train)"),
    logs: list[Path] = _LOGS,
    split: float = typer.Option(
        0.7, "--split", help="Evaluate on what follows this share of each log (0: all of it)"
    ),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the scores as JSON"),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress display"),
) -> None:
    """MAE, error by hit-rate bucket and calibration of MODEL against the raw index match
    and the approximate-mode match, on the later part of LOGs."""
    from router.predictor.evaluate import score_logs
    from router.predictor.persist import load_predictor
    from router.predictor.tables import bucket_table, calibration_table, summary_table

    predictor = load_predictor(model)
    data = _read(logs, not no_progress)
    evaluation, test = score_logs(predictor.predict, data, split)
    modes = ", ".join(sorted(set(test.index_mode.tolist())))
    console = Console()
    title = f"{model.name} on {len(test)} rows after the first {split:.0%} (index mode {modes})"
    console.print(summary_table(evaluation, title))
    console.print(bucket_table(evaluation))
    console.print(calibration_table(evaluation))
    if json_out is not None:
        body = {"model": str(model), "logs": [str(p) for p in logs], "split": split,
                "versions": predictor.versions, **evaluation.model_dump(mode="json")}  # fmt: skip
        json_out.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")


@predictor_app.command("odd-traffic")
def odd_traffic(
    logs: list[Path] = _LOGS,
    param: list[str] = typer.Option(
        [], "--param", metavar="KEY=VALUE", help="pdd-adaptive parameter, e.g. odd_unhinted=true"
    ),
    label_min_input: int | None = typer.Option(
        None, "--label-min-input", help="Odd label: input at least this (default odd_min_input)"
    ),
    label_max_output: int | None = typer.Option(
        None, "--label-max-output", help="Odd label: output at most this (default odd_max_output)"
    ),
) -> None:
    """Precision and recall of pdd-adaptive's odd-traffic classifier on LOGs."""
    from replay.presets.loader import parse_overrides
    from router.predictor.odd_traffic import odd_traffic_report

    report = odd_traffic_report(
        logs,
        parse_overrides(param),
        label_min_input=label_min_input,
        label_max_output=label_max_output,
    )

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    evidence = "; ".join(
        f"{k}: {v['true_positives']}/{v['classified']}" for k, v in report.by_evidence.items()
    )
    Console().print(
        f"{report.requests} requests, {report.odd} odd (input >= {report.label_min_input}, "
        f"output <= {report.label_max_output}); classified {report.classified}, "
        f"{report.true_positives} right: precision {pct(report.precision)}, recall "
        f"{pct(report.recall)}" + (f" [{evidence}]" if evidence else ""),
        highlight=False,
        soft_wrap=True,
    )

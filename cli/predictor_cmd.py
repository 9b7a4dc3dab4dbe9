"""`pdd-router predictor ...`: train and evaluate the hit-rate model on decision logs.

Decision logs come from `pdd-router replay run --decision-log FILE` (or the live
service): one line per decision, one per outcome; `predictor cross-eval` can also replay
kinds of traces into logs itself (``cli.predictor_suite``). scikit-learn is imported only when
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

from cli.console import stdout_console

if TYPE_CHECKING:
    from rich.progress import Progress
    from rich.table import Table

    from cli.predictor_suite import TraceKind
    from router.predictor.cross_eval import CrossEvalReport, CrossRow
    from router.predictor.dataset import Dataset
    from router.predictor.train import TrainParams

__all__ = ["predictor_app"]

predictor_app = typer.Typer(
    rich_markup_mode="markdown",
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
    stdout_console().print(
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
    console = stdout_console()
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
    stdout_console().print(
        f"{report.requests} requests, {report.odd} odd (input >= {report.label_min_input}, "
        f"output <= {report.label_max_output}); classified {report.classified}, "
        f"{report.true_positives} right: precision {pct(report.precision)}, recall "
        f"{pct(report.recall)}" + (f" [{evidence}]" if evidence else ""),
        highlight=False,
        soft_wrap=True,
    )


_CROSS_HELP = (
    "Leave one kind of trace out: for each kind, fit the model on the other kinds and score "
    "it on this one.\n\n"
    "A kind is one or more decision logs of one kind of traffic: give them as --log NAME=PATH "
    "(repeat a NAME to pool several logs), or let --suite replay them into --work: a YAML "
    "list of kinds (fields of cli.predictor_suite.TraceKind: name, trace or profile, "
    "requests, seed, preset, policy, overrides, index_mode, index_capacity, train), or "
    '"default": four synthetic agentic shapes (seeds, context lengths, session shapes, '
    "cache pressure) replayed with policy pdd in approximate mode, plus --conversation's "
    "trace, kept for testing only. A suite's logs are replayed once and reused.\n\n"
    "Every kind is held out in turn: the model is fitted on all rows of the other kinds "
    "(never on --test-only kinds) with predictor train's parameters (--param) and scored on "
    "every row of the held-out kind, per tier, against the raw index match and against "
    "lru_frac alone (an LRU of each instance's KV size run over the index's record). "
    "Writes OUT/cross_eval.json and OUT/cross_eval.csv."
)


@predictor_app.command("cross-eval", help=_CROSS_HELP)
def cross_eval(
    log: list[str] = typer.Option(
        [], "--log", metavar="NAME=PATH", help="A decision log of kind NAME (repeatable)"
    ),
    suite: str | None = typer.Option(
        None,
        "--suite",
        metavar="FILE|default",
        help="Replay these kinds into decision logs first (cached in --work)",
    ),
    conversation: Path | None = typer.Option(
        None, "--conversation", help="With --suite default: a conversation trace, test only"
    ),
    requests: int = typer.Option(
        2000, "--requests", min=1, help="With --suite default: requests per agentic kind"
    ),
    conversation_requests: int | None = typer.Option(
        None,
        "--conversation-requests",
        min=1,
        help="With --suite default: only the conversation trace's first N requests",
    ),
    index_mode: str = typer.Option(
        "approximate", "--index-mode", help="With --suite default: approximate or events"
    ),
    kv_event_delay: float = typer.Option(
        0.05, "--kv-event-delay", help="With --suite default and events: seconds late"
    ),
    work: Path | None = typer.Option(
        None, "--work", help="Folder of the suite's decision logs (default OUT/logs)"
    ),
    test_only: list[str] = typer.Option(
        [], "--test-only", metavar="NAME", help="A kind held out only, never trained on"
    ),
    param: list[str] = typer.Option(
        [], "--param", metavar="KEY=VALUE", help="Training parameter, as for predictor train"
    ),
    out: Path = typer.Option(Path("cross-eval-out"), "--out", help="Folder of the results"),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress display"),
) -> None:
    from cli.cross_eval_options import DefaultSuiteOptions, log_paths
    from cli.predictor_suite import load_suite
    from cli.progress import progress_bars
    from router.errors import UserError

    params = _training_params(param)
    paths = log_paths(log)
    default = DefaultSuiteOptions(
        conversation=conversation, requests=requests,
        conversation_requests=conversation_requests, index_mode=index_mode,
        kv_event_delay=kv_event_delay,
    )  # fmt: skip
    default.refuse_without_default_suite(suite)
    if suite is None and not paths:
        raise UserError("give decision logs (--log NAME=PATH) or a suite to replay (--suite)")
    test = set(test_only)
    with progress_bars(not no_progress) as bars:
        if suite is not None:
            kinds = default.kinds() if suite == "default" else load_suite(Path(suite))
            test |= _replay_suite(kinds, paths, work or out / "logs", bars)
        report = _hold_each_kind_out(paths, params, sorted(test), bars)
    _write_cross_eval(out, paths, report)


def _training_params(param: list[str]) -> TrainParams:
    """--param KEY=VALUE options as training parameters, refused by name when wrong."""
    from pydantic import ValidationError

    from replay.presets.loader import parse_overrides
    from router.errors import UserError
    from router.predictor.train import TrainParams, training_problems

    try:
        return TrainParams.model_validate(parse_overrides(param))
    except ValidationError as exc:
        raise UserError(f"bad training parameter: {training_problems(exc)}") from None


def _replay_suite(
    kinds: list[TraceKind], paths: dict[str, list[Path]], work: Path, bars: Progress | None
) -> set[str]:
    """Replay the suite's kinds into decision logs in ``work`` (or reuse them) and add
    them to ``paths``; the names of the kinds held out only."""
    from cli.predictor_suite import replay_kinds
    from cli.progress import ReplayBar
    from router.errors import UserError

    clash = sorted(set(paths) & {k.name for k in kinds})
    if clash:
        raise UserError(f"kind {', '.join(clash)} given both by --log and by the suite")
    replayed = replay_kinds(
        kinds,
        work,
        (lambda name: ReplayBar(bars, f"replaying {name}")) if bars is not None else None,
    )
    for name, replayed_log in replayed.items():
        paths[name] = [replayed_log]
    return {k.name for k in kinds if not k.train}


def _hold_each_kind_out(
    paths: dict[str, list[Path]], params: TrainParams, test_only: list[str], bars: Progress | None
) -> CrossEvalReport:
    """Read each kind's logs, then fit on the others and score on it, kind after kind."""
    from router.predictor.cross_eval import leave_one_kind_out
    from router.predictor.dataset import read_logs

    data: dict[str, Dataset] = {}
    reading = bars.add_task("reading logs", total=len(paths)) if bars is not None else None
    for name, logs in paths.items():
        data[name] = read_logs(logs)
        if bars is not None and reading is not None:
            bars.advance(reading)
    fitting = bars.add_task("fitting", total=len(data)) if bars is not None else None

    def advance(name: str) -> None:
        if bars is not None and fitting is not None:
            bars.update(fitting, description=f"fitting, {name} held out")
            done = list(data).index(name)
            bars.update(fitting, completed=done)

    return leave_one_kind_out(data, params, test_only=test_only, advance=advance)


def _write_cross_eval(out: Path, paths: dict[str, list[Path]], report: CrossEvalReport) -> None:
    """OUT/cross_eval.json and OUT/cross_eval.csv written, the table printed."""
    from router.predictor.cross_eval import write_csv

    out.mkdir(parents=True, exist_ok=True)
    body = {"logs": {k: [str(p) for p in v] for k, v in paths.items()},
            **report.model_dump(mode="json")}  # fmt: skip
    (out / "cross_eval.json").write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    write_csv(report.rows, out / "cross_eval.csv")
    console = stdout_console()
    if not console.is_terminal:  # a file or a pipe: wide enough for every column
        console.width = max(console.width, 110)
    console.print(_cross_table(report.rows))
    console.print(f"wrote {out / 'cross_eval.json'} and {out / 'cross_eval.csv'}", highlight=False)


def _cross_table(rows: list[CrossRow]) -> Table:
    from rich.table import Table

    table = Table(title="MAE on each held-out kind (model fitted on the other kinds)")
    for column in ("held out", "tier", "rows", "index match", "lru_frac", "model", "vs index",
                   "predicts"):  # fmt: skip
        left = column in ("held out", "tier")
        table.add_column(column, justify="left" if left else "right", no_wrap=left)
    for r in rows:
        lru = "-" if r.lru_mae is None else f"{r.lru_mae:.4f}"
        table.add_row(r.held_out, r.tier, str(r.rows), f"{r.index_mae:.4f}", lru,
                      f"{r.model_mae:.4f}", f"{-r.reduction:+.1%}", r.predicts)  # fmt: skip
    return table

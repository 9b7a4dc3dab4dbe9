"""`pdd-router replay validate-costs`: replay runs measured on real engines by others and
print how far the simulator's step costs land from them.

The replays are ``replay.experiments.published`` and the summary
``replay.experiments.published_check`` (imported when the command runs). Registered on
``replay_app`` by ``cli.replay_cmd``.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from cli.console import stdout_console

if TYPE_CHECKING:
    from rich.table import Table

    from replay.experiments.published_check import SetSummary

__all__ = ["validate_costs"]

_SOURCES = ("perfdb", "roofline")


def validate_costs(
    runs: Path | None = typer.Option(
        None,
        "--runs",
        help="CSV of measured runs in the shipped file's columns (default: "
        "the shipped set, AIConfigurator's silicon benchmark sample of vLLM, SGLang and "
        "TensorRT-LLM on H100 and H200, single-engine and disaggregated)",
    ),
    per_set: int | None = typer.Option(
        None,
        "--per-set",
        min=1,
        help="Replay at most this many runs of each set (engine, "
        "model, GPU), spread over the set (default: every run)",
    ),
    sources: list[str] = typer.Option(
        list(_SOURCES),
        "--source",
        help="Step-cost source to replay with: perfdb or roofline (repeatable)",
    ),
    out: Path = typer.Option(Path("validate-costs-out"), "--out", help="Directory to write"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table"),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar"),
) -> None:
    """Replay published measurements of real engines and print the simulator's errors.

    Each run is one engine (GPU, model, quantization, tensor parallelism, engine), or a
    prefill and a decode pool of them (disaggregated), benchmarked closed-loop at a fixed
    concurrency with one input and output length; it is replayed the same way on the
    same deployment priced by each --source (the disaggregated pools in one datacenter,
    the KV over its fabric), and its mean TTFT, TPOT and end-to-end latency are compared
    with the measured ones. Nothing is fitted to these runs. Per set: the median
    absolute relative error and the share of runs within 15% and 25%.

    Writes validate-costs.json (every run's measured and simulated means) in --out.
    """

    from cli.progress import progress_bars
    from replay.experiments.published import read_published
    from replay.experiments.published_check import check_runs, pick_runs, summarize_sets
    from router.errors import UserError

    unknown = [s for s in sources if s not in _SOURCES]
    if unknown:
        raise UserError(f"--source {unknown[0]!r} is not one of: {', '.join(_SOURCES)}")
    picked = pick_runs(read_published(runs), per_set)
    with progress_bars(not no_progress) as progress:
        task = progress.add_task("runs replayed", total=len(picked)) if progress else None

        def done(n: int) -> None:
            if progress is not None and task is not None:
                progress.update(task, completed=n)

        checked, unreplayed = check_runs(picked, list(dict.fromkeys(sources)), done)
    if not checked:
        reason = unreplayed[0].reason if unreplayed else "no run picked"
        raise UserError(f"no run could be replayed: {reason}")
    sets = summarize_sets(checked)
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "aiconfigurator_core": metadata.version("aiconfigurator-core"),
        "sets": [s.model_dump() for s in sets],
        "runs": [c.model_dump() for c in checked],
        "unreplayed": [u.model_dump() for u in unreplayed],
    }
    (out / "validate-costs.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    if as_json:
        typer.echo(json.dumps({"sets": report["sets"]}, indent=2))
        return
    console = stdout_console()
    console.print(_table(sets))
    if unreplayed:
        console.print(
            f"[yellow]warning:[/] {len(unreplayed)} of {len(picked)} runs could not be "
            f"replayed (listed in validate-costs.json), e.g. {unreplayed[0].run.id}: "
            f"{unreplayed[0].reason}",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
    console.print(f"wrote {out / 'validate-costs.json'}", highlight=False, soft_wrap=True)


def _table(sets: list[SetSummary]) -> Table:
    from rich.table import Table

    table = Table(title="replays of measured runs: median |error| (share within 15% / 25%)")
    table.add_column("set (engine/model/GPU, mode)")
    table.add_column("runs", justify="right")
    table.add_column("source")
    for metric in ("TTFT", "TPOT", "end-to-end"):
        table.add_column(f"{metric} mean", justify="right")
    for summary in sets:
        for source, metrics in summary.by_source.items():
            cells = [
                f"{100 * m.median_abs_error:.0f}% ({100 * m.within_15:.0f}% / "
                f"{100 * m.within_25:.0f}%)"
                for m in metrics.values()
            ]
            table.add_row(summary.name, str(summary.runs), source, *cells)
    return table

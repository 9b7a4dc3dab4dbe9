"""`pdd-router replay validate`: how far the simulator is from latencies measured on real
engines.

The command only reads, prints and writes; the comparison is
``replay.experiments.validate`` and the page ``replay.report.validate_report`` (imported
when the command runs, so ``--help`` stays instant). It is registered on ``replay_app``
by ``cli.replay_cmd``.
"""

from __future__ import annotations

from pathlib import Path

import typer

from cli.console import stdout_console

__all__ = ["validate"]


def validate(
    measured: Path = typer.Argument(
        ...,
        help="requests.jsonl measured on real engines (replay live), or aiperf's "
        "profile_export.jsonl, or the run or artifact directory holding it",
    ),
    simulated: Path = typer.Argument(
        ..., help="requests.jsonl of a simulated replay of the same trace, or its run directory"
    ),
    out: Path = typer.Option(Path("validate-out"), "--out", help="Directory to write"),
    ttft: str = typer.Option(
        "decode",
        "--ttft",
        help="TTFT definition: decode = ttft_s, the first token the client receives (from "
        "the decode side); prefill = ttft_prefill_s, the first token from the prefill side, "
        "before the KV transfer (both files must carry it)",
    ),
    trace: Path | None = typer.Option(
        None,
        "--trace",
        help="The trace aiperf replayed (Mooncake JSONL): matches aiperf's conversations and "
        "turns to its lines; needed only when its lines carry session_id or aiperf ran "
        "without --random-seed",
    ),
    json: bool = typer.Option(False, "--json", help="Print JSON instead of a table"),
) -> None:
    """Compare per-request latencies MEASURED on real engines with a SIMULATED replay.

    Requests are joined by request_id (the trace's line number). For TTFT,
    TPOT and end-to-end latency (seconds), over the requests finished in both
    runs: each side's mean, P50, P90 and P99 and the simulator's relative
    error (simulated - measured) / measured, the per-request MAPE and the
    Pearson correlation; then how many requests joined, were in one file
    only, or did not finish.

    TTFT is --ttft decode (ttft_s: the first token the client receives, from
    the decode side) or --ttft prefill (ttft_prefill_s: the first token from
    the prefill side, before the KV transfer; both files must carry it).

    MEASURED may also be NVIDIA aiperf's per-request export
    (profile_export.jsonl, or its artifact directory) of a Mooncake-trace
    replay: aiperf run with --random-seed names each trace line without a
    session_id session_NNNNNN, NNNNNN its line number; --trace matches any
    other naming to the lines.

    Writes validate.json and report.html (CDFs of both sides) in --out.
    """
    from json import dumps

    from cli.experiment_cmd import command_line
    from replay.experiments.validate import validate as compare_latencies
    from replay.metrics.aiperf_export import sessions_of
    from replay.metrics.run_latencies import latency_file, read_latencies
    from replay.report.validate_report import validate_table, write_validate_report
    from replay.trace.formats import read_trace

    sessions = sessions_of(read_trace(trace, "mooncake")) if trace is not None else None
    measured_file, simulated_file = latency_file(measured), latency_file(simulated)
    result = compare_latencies(
        read_latencies(measured_file, sessions),
        read_latencies(simulated_file, sessions),
        ttft,
        sources=(str(measured_file), str(simulated_file)),
    )
    result.write_json(out / "validate.json")
    write_validate_report(out / "report.html", result, command_line())
    if json:
        typer.echo(dumps(result.to_json(), indent=2))
        return
    console = stdout_console()
    console.print(validate_table(result))
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    console.print(
        f"wrote {out / 'validate.json'} and {out / 'report.html'}", highlight=False, soft_wrap=True
    )

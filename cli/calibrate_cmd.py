"""`pdd-router calibrate`: measure a running engine and fit the simulator's pass times.

The command parses options, shows progress and prints; the work is
``replay.runner.calibrate.calibrate`` (imported when the command runs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from cli.console import stdout_console

if TYPE_CHECKING:
    from cli.calibrate_options import CalibrateOptions
    from replay.presets.cluster_preset import ClusterPreset
    from replay.runner.calibrate import CalibrationResult
    from replay.runner.router_time import RouterTime

__all__ = ["calibrate"]


def calibrate(
    url: str = typer.Option(..., "--url", help="Base URL of the engine (OpenAI API)"),
    preset: str | None = typer.Option(
        None,
        "--preset",
        help="Write this preset (a name or a file) with the fitted timing in --pool's pools, "
        "as a preset file for --preset (default: write the fitted timing alone)",
    ),
    pool: list[str] = typer.Option(
        [],
        "--pool",
        help="Pools of --preset whose engines are like this one (repeatable; default: every pool)",
    ),
    out: Path = typer.Option(Path("calibrated.yaml"), "--out", help="YAML file to write"),
    model: str | None = typer.Option(None, "--model", help="The model field of each request"),
    api_key: str | None = typer.Option(None, "--api-key", help="Bearer key for the endpoint"),
    vocab_size: int = typer.Option(
        32_000, "--vocab-size", help="Token IDs are drawn below this (the model's vocabulary)"
    ),
    max_prompt: int = typer.Option(
        2048,
        "--max-prompt",
        help="Longest prompt a probe sends, below the model's length; a decode probe's prompt "
        "and its --decode-tokens together stay within it",
    ),
    max_batch: int = typer.Option(8, "--max-batch", help="Largest decode batch probed"),
    repeats: int = typer.Option(3, "--repeats", help="Measurements per probe (median)"),
    decode_tokens: int = typer.Option(
        96,
        "--decode-tokens",
        min=16,
        help="Tokens each decode probe's requests generate (and a quarter as many, to difference)",
    ),
    clock: str = typer.Option(
        "auto",
        "--clock",
        help="Whose clock times the probes: engine (its own prefill and decode times at "
        "/metrics, as vLLM exports them), client (each answer's round trip), or auto "
        "(engine when it exports them)",
    ),
    router: str | None = typer.Option(
        None,
        "--router",
        help="Base URL of a pdd-router in front of the engines: measure its time per "
        "request (its own, pdd_router_overhead_seconds, and the way to and from it, on "
        "requests sent one at a time) and write it as the preset's timing.router_s "
        "(needs --preset)",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the measurements as JSON"),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar"),
) -> None:
    """Measure a running engine's prefill and decode times and fit the simulator to them.

    Prefill: prompts of N new tokens after C cached ones, max_tokens 1. Decode: B
    requests at once, short and long prompts. Each is timed by the engine's own clock
    when it exports its request prefill and decode times (vLLM's /metrics), so the
    HTTP round trip and a busy client's delays are not taken for engine work. Fits a
    prefill pass as overhead + per token x N + per token pair x (N*C + N*N/2), a decode
    step as overhead + per request x B + per context token x (the batch's KV tokens), by
    least squares on relative errors, and prints each probe measured and fitted. With
    --preset, writes that preset with the fitted timing in its pools: replay a trace on
    it and set the replay against `replay live` on the same engines with `replay
    validate`.
    """
    from cli.calibrate_options import CalibrateOptions

    options = CalibrateOptions(
        url=url, preset=preset, pool=tuple(pool), out=out, model=model, api_key=api_key,
        vocab_size=vocab_size, max_prompt=max_prompt, max_batch=max_batch, repeats=repeats,
        decode_tokens=decode_tokens, clock=clock, router=router,
    )  # fmt: skip
    _run(options, as_json=as_json, progress=not no_progress)


def _run(options: CalibrateOptions, *, as_json: bool, progress: bool) -> None:
    """Check the router and the preset, measure, write --out, print what was measured."""
    from replay.runner.router_time import check_router, measure_router_s

    if options.router is not None:
        check_router(options.router, api_key=options.api_key)
    target = _target_preset(options)
    result = _measure(options, progress)
    measured_router = None
    if options.router is not None:
        measured_router = measure_router_s(
            options.router, model=options.model, api_key=options.api_key,
            vocab_size=options.vocab_size, max_prompt=options.max_prompt,
        )  # fmt: skip
    text = _written(options, result, target, measured_router)
    options.out.write_text(text, encoding="utf-8")
    console = stdout_console()
    if as_json:
        console.print_json(json.dumps(_json_payload(result, measured_router)))
    else:
        console.print(_table(result.to_json()))
    for line in _summary_lines(options, result, target is not None, measured_router):
        console.print(line, highlight=False, soft_wrap=True)


def _target_preset(options: CalibrateOptions) -> ClusterPreset | None:
    """--preset loaded, every --pool one of its pools (None without --preset)."""
    from replay.presets.loader import load_preset
    from router.errors import UserError

    if options.preset is None:
        return None
    target = load_preset(options.preset)
    unknown = [p for p in options.pool if p not in target.spec.pools]
    if unknown:
        raise UserError(
            f"--pool {unknown[0]!r} is not a pool of {options.preset}; its pools: "
            f"{', '.join(target.spec.pools)}"
        )
    return target


def _measure(options: CalibrateOptions, progress: bool) -> CalibrationResult:
    """The calibration, a progress bar advancing with each probe."""
    from cli.progress import progress_bars
    from replay.runner.calibrate import calibrate, probe_count

    probes = options.probes()
    with progress_bars(progress) as bars:
        task = (
            bars.add_task(f"calibrating {options.url}", total=probe_count(probes)) if bars else None
        )

        def step() -> None:
            if bars is not None and task is not None:
                bars.advance(task)

        return calibrate(probes, step)


def _written(
    options: CalibrateOptions,
    result: CalibrationResult,
    target: ClusterPreset | None,
    measured_router: RouterTime | None,
) -> str:
    """The YAML --out holds: the preset with the fitted timing in --pool's pools (every
    pool by default), or the fitted timing alone without --preset."""
    import yaml

    fitted = result.fitted.model_dump(mode="json")
    # the engine's KV memory as it reports it: its block size and, when known, its capacity
    layout = {"kv_block_tokens": result.kv_block_tokens,
              "kv_capacity_tokens": result.kv_capacity_tokens}  # fmt: skip
    layout = {k: v for k, v in layout.items() if v is not None}
    if target is None:
        return yaml.safe_dump({**layout, "fitted": fitted}, sort_keys=False, width=88)
    tree = target.resolved()
    for name in options.pool or list(tree["pools"]):
        tree["pools"][name].update(layout)
        tree["pools"][name]["fitted"] = fitted
    # measured engines behind the router: the first token is the decode side's
    tree["timing"]["first_token_on_decode"] = True
    if measured_router is not None:
        tree["timing"]["router_s"] = round(measured_router.router_s, 6)
    return f"# {options.preset} calibrated on {options.url} by pdd-router calibrate\n" + (
        yaml.safe_dump(tree, sort_keys=False, width=88)
    )


def _json_payload(result: CalibrationResult, measured_router: RouterTime | None) -> dict[str, Any]:
    """--json's measurements, the router's time among them when it was measured."""
    payload = result.to_json()
    if measured_router is not None:
        payload["router_s"] = round(measured_router.router_s, 6)
        payload["router_own_s"] = round(measured_router.own_s, 6)
        payload["router_path_s"] = round(measured_router.path_s, 6)
    return payload


def _summary_lines(
    options: CalibrateOptions,
    result: CalibrationResult,
    wrote_preset: bool,
    measured_router: RouterTime | None,
) -> list[str]:
    """The lines printed after the probes: warnings, whose clock timed them, the engine's
    KV blocks, the router's time, the fit's error and the file written."""
    lines = [f"[yellow]warning:[/] {warning}" for warning in result.warnings]
    lines.append(
        "timed by the engine's clock (its /metrics); a request's time in the engine's server "
        f"outside its prefill: {result.outside_engine_s * 1e3:.1f} ms (median; "
        f"fitted.frontend_s), less the {(result.round_trip_s or 0.0) * 1e3:.1f} ms round "
        "trip of GET /v1/models"
        if result.outside_engine_s is not None
        else "timed by the client's clock (round trips)"
    )
    if result.kv_block_tokens is not None:
        capacity = result.kv_capacity_tokens
        lines.append(
            f"the engine's KV blocks: {result.kv_block_tokens} tokens (kv_block_tokens)"
            + (f", {capacity:,} tokens in all (kv_capacity_tokens)" if capacity else "")
            + (", written in the pools' settings, in place of those the preset had"
               if wrote_preset else "")
        )  # fmt: skip
    if measured_router is not None:
        lines.append(
            f"the router's time before a first token: {measured_router.router_s * 1e3:.2f} ms "
            f"a request, written as timing.router_s: its own "
            f"{measured_router.own_s * 1e3:.2f} ms (pdd_router_overhead_seconds) and "
            f"{measured_router.path_s * 1e3:.2f} ms on the way to and from it (the client's "
            f"time to first token less the router's), means over {measured_router.requests} "
            "requests sent one at a time"
        )
    lines.append(
        f"fit error (mean |fitted - measured| / measured): prefill {result.prefill_error:.1%}, "
        f"decode {result.decode_error:.1%}; {result.wall_s:.0f} s; wrote {options.out}"
    )
    return lines


def _table(data: dict[str, object]) -> Table:
    table = Table(title="Calibration probes: measured and fitted (ms)")
    for column in ("probe", "measured", "fitted", "error"):
        table.add_column(column, justify="right" if column != "probe" else "left")
    rows: list[tuple[str, float, float]] = []
    for p in data["prefill"]:  # type: ignore[attr-defined]
        rows.append((f"prefill {p['new']} new after {p['cached']} cached",
                     p["measured_s"], p["fitted_s"]))  # fmt: skip
    for d in data["decode"]:  # type: ignore[attr-defined]
        rows.append((f"decode step, batch {d['batch']}, {d['context_tokens']:,.0f} KV tokens",
                     d["measured_s"], d["fitted_s"]))  # fmt: skip
    for name, measured, fitted in rows:
        error = (fitted - measured) / measured if measured else 0.0
        table.add_row(name, f"{measured * 1e3:,.2f}", f"{fitted * 1e3:,.2f}", f"{error:+.1%}")
    return table

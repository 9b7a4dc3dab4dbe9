"""`pdd-router calibrate`: measure a running engine and fit the simulator's pass times.

The command parses options, shows progress and prints; the work is
``replay.runner.calibrate.calibrate`` (imported when the command runs).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

__all__ = ["calibrate"]


def calibrate(  # noqa: C901 -- checks each option and names the bad one
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
    import yaml

    from cli.progress import progress_bars
    from replay.presets.loader import load_preset
    from replay.runner.calibrate import (
        SHORT_PROMPT,
        CalibrationOptions,
        calibrate,
        probe_count,
    )
    from replay.runner.router_time import check_router, measure_router_s
    from router.errors import UserError

    if max_prompt < 512 or max_batch < 1:
        raise UserError("--max-prompt must be at least 512 and --max-batch at least 1")
    # the long decode probes' prompts (--max-prompt less --decode-tokens) at least twice the
    # short ones', so that their contexts differ
    if decode_tokens > max_prompt - 2 * SHORT_PROMPT:
        raise UserError(
            f"--decode-tokens {decode_tokens} leaves too little room for a long decode probe's "
            f"prompt within --max-prompt {max_prompt}: at most {max_prompt - 2 * SHORT_PROMPT}"
        )
    if clock not in ("auto", "engine", "client"):
        raise UserError(f"--clock {clock!r}: expected auto, engine or client")
    news = tuple(n for n in (64, 256, 512, 1024, 2048, 4096, 8192) if n <= max_prompt // 2)
    options = CalibrationOptions(
        url=url.rstrip("/"), model=model, api_key=api_key, vocab_size=vocab_size,
        new_tokens=news, cached_tokens=(0, max_prompt // 2),
        batches=tuple(b for b in (1, 2, 4, 8, 16, 32, 64) if b <= max_batch),
        long_prompt=max_prompt - decode_tokens, repeats=repeats, decode_tokens=decode_tokens,
        clock=clock,  # type: ignore[arg-type]  # checked above
    )  # fmt: skip
    if router is not None and preset is None:
        raise UserError("--router needs --preset: timing.router_s is a setting of a preset")
    if router is not None:
        check_router(router, api_key=api_key)
    target = load_preset(preset) if preset is not None else None
    if target is not None:
        unknown = [p for p in pool if p not in target.spec.pools]
        if unknown:
            raise UserError(
                f"--pool {unknown[0]!r} is not a pool of {preset}; its pools: "
                f"{', '.join(target.spec.pools)}"
            )
    with progress_bars(not no_progress) as bars:
        task = bars.add_task(f"calibrating {url}", total=probe_count(options)) if bars else None

        def step() -> None:
            if bars is not None and task is not None:
                bars.advance(task)

        result = calibrate(options, step)
    measured_router = None
    if router is not None:
        measured_router = measure_router_s(
            router, model=model, api_key=api_key, vocab_size=vocab_size, max_prompt=max_prompt
        )
    fitted = result.fitted.model_dump(mode="json")
    # the engine's KV memory as it reports it: its block size and, when known, its capacity
    layout = {"kv_block_tokens": result.kv_block_tokens,
              "kv_capacity_tokens": result.kv_capacity_tokens}  # fmt: skip
    layout = {k: v for k, v in layout.items() if v is not None}
    if target is not None:
        tree = target.resolved()
        for name in pool or list(tree["pools"]):
            tree["pools"][name].update(layout)
            tree["pools"][name]["fitted"] = fitted
        # measured engines behind the router: the first token is the decode side's
        tree["timing"]["first_token_on_decode"] = True
        if measured_router is not None:
            tree["timing"]["router_s"] = round(measured_router.router_s, 6)
        text = f"# {preset} calibrated on {url} by pdd-router calibrate\n" + yaml.safe_dump(
            tree, sort_keys=False, width=88
        )
    else:
        text = yaml.safe_dump({**layout, "fitted": fitted}, sort_keys=False, width=88)
    out.write_text(text, encoding="utf-8")
    console = Console()
    if as_json:
        payload = result.to_json()
        if measured_router is not None:
            payload["router_s"] = round(measured_router.router_s, 6)
            payload["router_own_s"] = round(measured_router.own_s, 6)
            payload["router_path_s"] = round(measured_router.path_s, 6)
        console.print_json(json.dumps(payload))
    else:
        console.print(_table(result.to_json()))
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    timed = (
        "timed by the engine's clock (its /metrics); a request's time in the engine's server "
        f"outside its prefill: {result.outside_engine_s * 1e3:.1f} ms (median; "
        f"fitted.frontend_s), less the {(result.round_trip_s or 0.0) * 1e3:.1f} ms round "
        "trip of GET /v1/models"
        if result.outside_engine_s is not None
        else "timed by the client's clock (round trips)"
    )
    console.print(timed, highlight=False, soft_wrap=True)
    if result.kv_block_tokens is not None:
        capacity = result.kv_capacity_tokens
        console.print(
            f"the engine's KV blocks: {result.kv_block_tokens} tokens (kv_block_tokens)"
            + (f", {capacity:,} tokens in all (kv_capacity_tokens)" if capacity else "")
            + (", written in the pools' settings, in place of those the preset had"
               if target is not None else ""),
            highlight=False, soft_wrap=True,
        )  # fmt: skip
    if measured_router is not None:
        console.print(
            f"the router's time before a first token: {measured_router.router_s * 1e3:.2f} ms "
            f"a request, written as timing.router_s: its own "
            f"{measured_router.own_s * 1e3:.2f} ms (pdd_router_overhead_seconds) and "
            f"{measured_router.path_s * 1e3:.2f} ms on the way to and from it (the client's "
            f"time to first token less the router's), means over {measured_router.requests} "
            "requests sent one at a time",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
    console.print(
        f"fit error (mean |fitted - measured| / measured): prefill {result.prefill_error:.1%}, "
        f"decode {result.decode_error:.1%}; {result.wall_s:.0f} s; wrote {out}",
        highlight=False, soft_wrap=True,
    )  # fmt: skip


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

"""The tables `pdd-router bench load` prints: its configuration, the routes and streaming
completions of each replica count, and a soak's rates and resident memory."""

from __future__ import annotations

from typing import Any

from bench.load_bench import LoadResult, ReplicaRun
from bench.load_traffic import GROUPS, WARMUP_S

__all__ = ["render_load_config", "render_load_results", "render_soak"]


def render_load_config(result: LoadResult) -> Any:
    from rich.table import Table

    c = result.config
    p, rld, md = c.engines
    table = Table(title="Load test configuration (loopback, processes started by the run)")
    table.add_column("setting")
    table.add_column("value")
    rows = [
        ("replicas", " and ".join(map(str, c.replicas))
         + (" (several: the Redis index, shared)" if max(c.replicas) > 1 else "")),
        ("index backend", ", ".join(f"{n}: {c.index_of(n)}" for n in c.replicas)),
        ("engines", f"{p} P, {rld} RLD, {md} MD (engine-sim, decode {c.decode_ms:g} ms/token, "
                    f"cache {c.engine_cache_blocks():,} blocks each)"),
        ("prompt tokens", f"{c.prompt_tokens:,} (1/8 common, 3/4 shared by one of {GROUPS} "
                          "groups, 1/4 distinct)"),
        ("routes", f"{c.connections} kept-alive connections, round robin over the replicas"),
        ("completions", f"{c.concurrency} concurrent streams of {c.output_tokens} tokens, "
                        "each prompt new, round robin"),
        ("seconds per phase", f"{c.seconds:g} (after {WARMUP_S:g} s of warm-up)"),
    ]  # fmt: skip
    if c.soak_minutes > 0:
        rows.append(("soak", f"{c.soak_minutes:g} min: {c.soak_routes_per_s:g} routes/s and "
                             f"{c.soak_completions_per_s:g} completions/s, memory every "
                             f"{c.sample_s:g} s"))  # fmt: skip
    ends = ", ".join(f"{r.load_average:.2f}" for r in result.runs)
    rows += [("cores", str(result.cores)),
             ("load average (1 min)", f"{result.load_average_start:.2f} at the start, "
                                      f"{ends} after each replica count")]  # fmt: skip
    for name, value in rows:
        table.add_row(name, value)
    return table


def _ms(value: float) -> str:
    return "-" if value != value else f"{value:,.1f}"  # NaN: nothing answered


def render_load_results(result: LoadResult) -> Any:
    from rich.table import Table

    c = result.config
    table = Table(title=f"Routes and streaming completions, {c.prompt_tokens:,}-token prompts")
    table.caption = (
        "router CPU: the replicas' CPU time over the completions phase, per completion "
        f"answered ({c.output_tokens} tokens each; its growth with --output-tokens is the "
        "cost of a streamed token)"
    )
    columns = ("replicas", "index", "routes/s", "route p50 / p99 (ms)", "route errors",
               "completions/s", "TTFT p50 / p99 (ms)", "completion errors",
               "router CPU per completion (ms)")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="right")
    for run in result.runs:
        cells = [str(run.replicas), run.index]
        for phase in (run.routes, run.completions):
            if phase is None:
                cells += ["-", "-", "-"]
            else:
                cells += [f"{phase.per_s:,.1f}", f"{_ms(phase.p50_ms)} / {_ms(phase.p99_ms)}",
                          str(phase.errors)]  # fmt: skip
        cpu = run.router_cpu_per_completion_s
        cells.append("-" if cpu is None else f"{cpu * 1e3:,.2f}")
        table.add_row(*cells)
    return table


def render_soak(run: ReplicaRun) -> list[Any]:
    from rich.table import Table

    soak = run.soak
    assert soak is not None
    summary = Table(title=f"Soak, {run.replicas} replica{'s' if run.replicas > 1 else ''}: "
                          f"{soak.minutes:g} min at steady rates")  # fmt: skip
    for col in ("requests", "per s", "p50 / p99 (ms)", "errors"):
        summary.add_column(col, justify="right")
    for name, phase in (("routes", soak.routes), ("completions (TTFT)", soak.completions)):
        summary.add_row(name, f"{phase.per_s:,.1f}", f"{_ms(phase.p50_ms)} / {_ms(phase.p99_ms)}",
                        str(phase.errors))  # fmt: skip
    summary.caption = f"requests sent later than their slot: {soak.late}"
    memory = Table(title="Resident memory (MB)")
    memory.caption = "index blocks: the blocks the first replica's index records (all instances)"
    memory.add_column("seconds", justify="right")
    for name in soak.processes:
        memory.add_column(name, justify="right")
    blocks = soak.index_blocks if len(soak.index_blocks) == len(soak.samples) else []
    if blocks:
        memory.add_column("index blocks", justify="right")
    for i, (t, values) in enumerate(soak.samples):
        extra = [f"{blocks[i]:,.0f}"] if blocks else []
        memory.add_row(f"{t:,.0f}", *(f"{v:,.1f}" for v in values), *extra)
    first = next((i for i, (t, _) in enumerate(soak.samples) if t >= soak.baseline_s), 0)
    extra = [f"{blocks[-1] - blocks[first]:+,.0f}"] if blocks else []
    memory.add_row(f"growth since {soak.baseline_s:,.0f} s",
                   *(f"{g:+,.1f}" for g in soak.growth_mb), *extra, style="bold")  # fmt: skip
    return [summary, memory]

"""Entry point of the `pdd-router` command: sub-commands, and user errors shown in one line."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from cli.bench_cmd import bench_app
from cli.calibrate_cmd import calibrate
from cli.demo_cmd import demo
from cli.engine_cmd import engine_app
from cli.kv_relay_cmd import kv_relay
from cli.predictor_cmd import predictor_app
from cli.replay_cmd import replay_app
from cli.serve_cmd import serve
from cli.trace_cmd import trace_app
from router import __version__
from router.errors import UserError

__all__ = ["app", "main", "run"]

app = typer.Typer(
    rich_markup_mode="markdown",
    name="pdd-router",
    help=(
        "Control plane for two-datacenter PDD serving (Prefill / RelayDecode / MainDecode): "
        "prefix-cache-aware routing, trace statistics, replay and benchmarks."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(trace_app, name="trace")
app.add_typer(replay_app, name="replay")
app.add_typer(bench_app, name="bench")
app.add_typer(predictor_app, name="predictor")
app.add_typer(engine_app, name="engine-sim")
app.command("demo")(demo)
app.command("serve")(serve)
app.command("calibrate")(calibrate)
app.command("kv-relay")(kv_relay)


@app.command("version")
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code; a UserError becomes one red line and code 2."""
    try:
        app(args=argv, prog_name="pdd-router")
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except UserError as exc:
        Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {exc}", highlight=False)
        return 2
    return 0


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    run()

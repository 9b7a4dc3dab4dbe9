"""Entry point of the `pdd-router` command: sub-commands, and user errors shown in one line."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO, cast

import structlog
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


def _readable_option_types() -> None:
    """typer (0.2x) labels a flag's type ``<bool>`` in --help, as if it took a value
    (``--no-progress true`` is refused), and a repeatable option's or argument's
    ``<list[int]>``, a Python type: show no type for a flag and ``<int>...`` for a
    repeatable one, as click does, and ``<int> [x>=1]`` for ``<int range> [x>=1]`` (which
    cut long option names short at 80 columns). Leaves typer versions without these labels
    alone."""
    from typer import core

    # an argument's name already ends in "..." when it repeats
    for kind, repeats in ((core.TyperOption, "..."), (core.TyperArgument, "")):
        shown = getattr(kind, "display_type_rich", None)
        if shown is not None and not getattr(shown, "readable", False):
            kind.display_type_rich = _readable(shown, repeats)  # type: ignore[method-assign,assignment]


def _readable(shown: Callable[..., object], repeats: str) -> Callable[..., object]:
    def display_type_rich(self: Any, ctx: Any) -> object:
        if getattr(self, "is_flag", False) and self.metavar is None:
            return None
        text = shown(self, ctx)
        if isinstance(text, str) and text.startswith("<list[") and "]>" in text:
            inner, _, rest = text[6:].partition("]>")
            return f"<{inner}>{rest or repeats}"
        if isinstance(text, str):  # "<int range> [x>=1]": the bounds say it is a range
            return text.replace(" range>", ">")
        return text

    display_type_rich.readable = True  # type: ignore[attr-defined]
    return display_type_rich


_readable_option_types()

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


class _CurrentStderr:
    """Whatever ``sys.stderr`` is when a line is written, not when logging was set up: a
    caller that swaps stderr (a test capturing it) must not leave the logger a closed file."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code; a UserError becomes one red line and code 2."""
    # log lines go to stderr: stdout carries what a command prints (tables, --json)
    stderr = cast(TextIO, _CurrentStderr())  # the two methods a PrintLogger calls
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(stderr))
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

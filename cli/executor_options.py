"""`--executor`, `--workers` and `--ray-address`: where a command's independent replays run.

``replay sweep``, ``compare`` and ``tune`` declare these options and open the executor
with ``open_executor`` (which checks them, and releases the workers at the end). The
executor module is imported only when a command runs, so ``--help`` stays instant.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from replay.experiments.executor import Executor

__all__ = ["EXECUTOR", "RAY_ADDRESS", "WORKERS", "open_executor"]

EXECUTOR = typer.Option(
    "serial",
    "--executor",
    metavar="serial|process|ray",
    help="Where the independent replays run: serial (one after the other, in this process), "
    "process (worker processes on this machine) or ray (Ray tasks on a local Ray, or on the "
    "cluster at --ray-address). The results are the same; only the time differs",
)
WORKERS = typer.Option(
    None,
    "--workers",
    metavar="N",
    help="Replays at once with --executor process or ray (default: this machine's cores; on "
    "a Ray cluster, its CPUs)",
)
RAY_ADDRESS = typer.Option(
    None,
    "--ray-address",
    metavar="ADDR",
    help="With --executor ray: an existing Ray cluster (HOST:PORT, ray://HOST:PORT or auto; "
    "its nodes need pdd-router and the trace at the same path); without it a local Ray",
)


@contextmanager
def open_executor(kind: str, workers: int | None, ray_address: str | None) -> Iterator[Executor]:
    """The executor the options name (a UserError naming the option when one is wrong),
    closed when the block ends."""
    from replay.experiments.executor import EXECUTOR_KINDS, make_executor
    from router.errors import UserError

    if kind not in EXECUTOR_KINDS:
        raise UserError(f"--executor must be serial, process or ray, got {kind!r}")
    if workers is not None and kind == "serial":
        raise UserError("--workers is for --executor process or ray (serial runs one at a time)")
    executor = make_executor(kind, workers, ray_address)
    try:
        yield executor
    finally:
        executor.close()

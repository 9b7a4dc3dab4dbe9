"""Progress bars for long CLI work: a rich bar on a terminal, nothing otherwise."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TimeElapsedColumn

__all__ = ["ReplayProgress", "replay_progress"]


class ReplayProgress:
    """Feeds a simulator's progress (finished requests) to one bar per replay."""

    def __init__(self, progress: Progress, description: str) -> None:
        self._progress = progress
        self._description = description
        self._task: TaskID | None = None

    def describe(self, description: str) -> None:
        """Name the next replay's bar."""
        self._description = description

    def start(self, total: int) -> None:
        self._task = self._progress.add_task(self._description, total=total)

    def advance(self, finished: int) -> None:
        if self._task is not None:
            self._progress.update(self._task, completed=finished)


@contextlib.contextmanager
def replay_progress(
    enabled: bool, description: str = "replaying"
) -> Iterator[ReplayProgress | None]:
    """A bar on stderr when it is a terminal and progress is wanted; otherwise None."""
    console = Console(stderr=True)
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    columns = ("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=console, transient=True) as progress:
        yield ReplayProgress(progress, description)

"""Progress bars for long CLI work: a rich bar on a terminal's stderr, nothing otherwise.

``progress_bars`` opens one rich Progress (or yields None when output is not a
terminal or progress is off); ``ReplayBar`` is one replay's bar in it, fed by the
simulator's progress observer calls; ``ReplayCount`` counts the replays done when they
run on other workers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TimeElapsedColumn

__all__ = ["ReplayBar", "ReplayCount", "progress_bars"]


class ReplayBar:
    """One replay's bar: told the number of requests, then how many have finished."""

    def __init__(self, progress: Progress, description: str) -> None:
        self._progress = progress
        self._description = description
        self._task: TaskID | None = None

    def start(self, total: int) -> None:
        self._task = self._progress.add_task(self._description, total=total)

    def advance(self, finished: int) -> None:
        if self._task is not None:
            self._progress.update(self._task, completed=finished)


class ReplayCount:
    """Replays finished out of those started ("replays done N/M"), for replays run on other
    workers: a replay's own progress cannot cross processes."""

    def __init__(self, progress: Progress, total: int | None = None) -> None:
        self._progress = progress
        self._task = progress.add_task("replays done", total=total)

    def __call__(self, finished: int, started: int | None = None) -> None:
        if started is None:
            self._progress.update(self._task, completed=finished)
        else:
            self._progress.update(self._task, completed=finished, total=started)


@contextmanager
def progress_bars(enabled: bool) -> Iterator[Progress | None]:
    """A rich Progress on stderr when it is a terminal and progress is wanted, else None."""
    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield None
        return
    columns = ("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=console, transient=True) as progress:
        yield progress

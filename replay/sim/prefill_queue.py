"""A FIFO server that runs jobs in batches: the prefill queue of one P instance."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from replay.sim.busy_time import BusyTime
from replay.sim.event_loop import EventLoop
from replay.sim.events import Priority

__all__ = ["PrefillQueue"]

T = TypeVar("T")


def _always(_: object) -> bool:
    return True


class PrefillQueue(Generic[T]):
    """Jobs wait in arrival order; when idle, the server takes a batch from the head.

    A batch holds the head job and the following ones while their sizes (new tokens)
    fit in ``batch_tokens`` (0: one job at a time). ``admit(job)`` may refuse the head
    (no memory yet): the server then waits until ``kick()`` is called. The batch runs
    for ``cost(batch)`` seconds, then ``on_done`` is called for each job in order.
    """

    __slots__ = (
        "_admit",
        "_batch_tokens",
        "_cost",
        "_loop",
        "_on_change",
        "_on_done",
        "_queue",
        "busy",
        "busy_time",
        "queued_tokens",
        "running",
    )

    def __init__(
        self,
        loop: EventLoop,
        cost: Callable[[list[T]], float],
        on_done: Callable[[T], None],
        *,
        admit: Callable[[T], bool] = _always,
        batch_tokens: int = 0,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self._loop = loop
        self._cost = cost
        self._on_done = on_done
        self._admit = admit
        self._batch_tokens = batch_tokens
        self._on_change = on_change
        self._queue: deque[tuple[T, int]] = deque()
        self.busy = False
        self.busy_time = BusyTime()  # while a batch runs
        self.running: list[T] = []
        self.queued_tokens = 0

    def __len__(self) -> int:
        return len(self._queue)

    def submit(self, job: T, size: int = 1) -> None:
        """Queue a job of ``size`` new tokens; start at once when the server is idle."""
        self._queue.append((job, size))
        self.queued_tokens += size
        if not self.busy:
            self._start()
        elif self._on_change is not None:
            self._on_change()

    @property
    def idle(self) -> bool:
        """Nothing running and nothing waiting."""
        return not self.busy and not self._queue

    def run_alone(self, job: T) -> None:
        """Run an admitted ``job`` at once, a batch of its own (the server is ``idle``):
        what ``submit`` does then. Its size is not needed: it counts only in the queued
        tokens and against the batch limit of the jobs behind it, and there are none."""
        batch = [job]
        self.busy = True
        self.busy_time.set(True, self._loop.now)
        self.running = batch
        self._loop.after(self._cost(batch), Priority.PREFILL, self._done, batch)
        if self._on_change is not None:
            self._on_change()

    def kick(self) -> None:
        """Something the head job waited for (memory) may be available now."""
        if not self.busy and self._queue:
            self._start()

    def _start(self) -> None:
        queue, limit = self._queue, self._batch_tokens
        batch: list[T] = []
        tokens = 0
        while queue:
            job, size = queue[0]
            if batch and (limit <= 0 or tokens + size > limit):
                break
            if not self._admit(job):
                break
            queue.popleft()
            self.queued_tokens -= size
            batch.append(job)
            tokens += size
        if batch:
            self.busy = True
            self.busy_time.set(True, self._loop.now)
            self.running = batch
            self._loop.after(self._cost(batch), Priority.PREFILL, self._done, batch)
        if self._on_change is not None:
            self._on_change()

    def _done(self, batch: list[T]) -> None:
        self.busy = False
        self.running = []
        for job in batch:
            self._on_done(job)
        self._start()
        self.busy_time.set(self.busy, self._loop.now)

"""The one lane through which the service uses a shared index, off the event loop.

A Redis index answers in a fraction of a millisecond, until Redis hangs: then each call
waits for its socket timeout. So with a shared index every use of it by the service
(decisions, KV-event ingestion, block counts, its health check, the sessions the
scheduler keeps) runs on one worker thread, in the order it was asked for, and the event
loop only awaits the answer: a hung Redis holds this lane, never ``/healthz`` or a
stream in flight. One thread, so the index, its local mirror and the scheduler's state
are never used by two threads at once. With the in-memory index, calls run inline.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["IndexLane"]

P = ParamSpec("P")
T = TypeVar("T")


class IndexLane:
    """Runs index work in order on one thread (``threaded``), or inline."""

    def __init__(self, *, threaded: bool) -> None:
        self._executor = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="pdd-index") if threaded else None
        )

    @property
    def threaded(self) -> bool:
        return self._executor is not None

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on the lane; its result or its exception."""
        if self._executor is None:
            return fn(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def submit(self, fn: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> None:
        """``fn(*args, **kwargs)`` on the lane, without waiting (in order with the rest)."""
        if self._executor is None:
            fn(*args, **kwargs)
        else:
            self._executor.submit(fn, *args, **kwargs)

    def close(self) -> None:
        """Let queued work finish; take no more."""
        if self._executor is not None:
            self._executor.shutdown(wait=False)

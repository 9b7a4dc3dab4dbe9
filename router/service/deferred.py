"""Calls run a little later on the event loop, all of them run at shutdown at the latest."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

__all__ = ["Deferred"]

log = structlog.get_logger("pdd_router.service")


class Deferred:
    """Calls waiting for their time (an outcome line waiting for late KV events)."""

    def __init__(self) -> None:
        self._waiting: dict[asyncio.TimerHandle, Callable[[], None]] = {}
        self.flushed = False  # shutdown ran the waiting calls: later ones run at once

    def __len__(self) -> int:
        return len(self._waiting)

    def defer(self, delay_s: float, call: Callable[[], None]) -> None:
        """Run ``call`` in ``delay_s`` on the running loop (at once when there is none, or
        once shutdown has flushed); ``flush`` runs what is still waiting then. A call that
        fails is logged, and the others still run."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or self.flushed:
            _run_logged(call)
            return
        handle: asyncio.TimerHandle | None = None

        def run() -> None:
            assert handle is not None
            self._waiting.pop(handle, None)
            _run_logged(call)

        handle = loop.call_later(delay_s, run)
        self._waiting[handle] = call

    def flush(self) -> None:
        """Run every waiting call now (shutdown: nothing waiting is lost); later ones run
        at once."""
        self.flushed = True
        pending, self._waiting = self._waiting, {}
        for handle, call in pending.items():
            handle.cancel()
            _run_logged(call)


def _run_logged(call: Callable[[], None]) -> None:
    try:
        call()
    except Exception as exc:  # e.g. the log's disk is full: the service goes on
        log.error("deferred outcome failed", error=str(exc))

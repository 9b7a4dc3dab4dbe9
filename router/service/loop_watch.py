"""How long the router's event loop is held, and by what.

Every ``/healthz``, every token relayed to a client waits for the event loop. A tick
sleeps ``interval_s`` on the loop and measures how late it wakes up: its *lag*, what any
callback due then waited. A lag has two causes that look the same from the outside:

- the router held its own loop: a callback computing (a large JSON body parsed, a
  template rendered on the loop), a blocking call made from it, or another of the
  router's threads holding the GIL;
- the machine did not run it: the loop thread was ready, waiting for a CPU that other
  processes had (a loaded host, a CI machine running tests beside the router).

The kernel counts the second (``/proc/thread-self/schedstat``: the time a thread waited
on a run queue). A tick's *held* time is its lag less the time the loop thread waited
for a CPU meanwhile: what the router itself is to answer for, however busy the machine.
Where the kernel does not say (not Linux, or no scheduler statistics), held is the lag.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Histogram

__all__ = ["LOOP_BUCKETS_S", "LoopWatch", "runqueue_wait_s"]

LOOP_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Histogram buckets of both series: 0.1 s is the bound ``/healthz`` is held to."""

_SCHEDSTAT = Path("/proc/thread-self/schedstat")


def runqueue_wait_s() -> float | None:
    """Seconds the calling thread has waited for a CPU while ready to run (None: the
    kernel does not say)."""
    try:
        fields = _SCHEDSTAT.read_text().split()
        return int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class LoopWatch:
    """Ticks on the event loop; each tick's lag and held time go to two histograms,
    ``pdd_router_event_loop_lag_seconds`` and ``pdd_router_event_loop_held_seconds``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        interval_s: float = 0.01,
        clock: Callable[[], float] = time.perf_counter,
        waited: Callable[[], float | None] = runqueue_wait_s,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.interval_s = interval_s
        self._clock = clock
        self._waited = waited
        self._last: tuple[float, float | None] = (0.0, None)  # the last tick's end
        self.lag = Histogram(
            "pdd_router_event_loop_lag_seconds",
            f"How late a tick of the event loop (every {interval_s:g} s) ran: what a "
            "callback due then, /healthz among them, waited",
            buckets=LOOP_BUCKETS_S, registry=registry,
        )  # fmt: skip
        self.held = Histogram(
            "pdd_router_event_loop_held_seconds",
            "The same lag less the time the loop's thread waited for a CPU meanwhile (the "
            "kernel's run-queue wait): how long the router's own work held its loop, "
            "whatever else the machine ran",
            buckets=LOOP_BUCKETS_S, registry=registry,
        )  # fmt: skip

    def tick(self, started: float, waited_before: float | None) -> tuple[float, float]:
        """Record one tick begun at ``started`` (the clock) with the thread's run-queue
        wait then; its (lag, held) in seconds. Its end is the next tick's start."""
        ended, waited_after = self._clock(), self._waited()
        self._last = (ended, waited_after)
        lag = max(ended - started - self.interval_s, 0.0)
        queued = (waited_after - waited_before
                  if waited_before is not None and waited_after is not None else 0.0)  # fmt: skip
        held = min(max(lag - queued, 0.0), lag)
        self.lag.observe(lag)
        self.held.observe(held)
        return lag, held

    async def run(self) -> None:
        """Forever, on the loop it watches (one clock and one kernel reading a tick)."""
        self._last = (self._clock(), self._waited())
        while True:
            await asyncio.sleep(self.interval_s)
            self.tick(*self._last)

"""The event loop's watch: a tick's lag, and the part of it the router's own work held
the loop (the lag less the loop thread's wait for a CPU)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from prometheus_client import CollectorRegistry

from router.service.loop_watch import LoopWatch, runqueue_wait_s


def counts(registry: CollectorRegistry, name: str) -> dict[str, float]:
    """Cumulative bucket counts of one histogram, by ``le``."""
    return {
        sample.labels["le"]: sample.value
        for metric in registry.collect() if metric.name == name
        for sample in metric.samples if sample.name == f"{name}_bucket"
    }  # fmt: skip


class Clocks:
    def __init__(self) -> None:
        self.now = 10.0
        self.queued: float | None = 1.0

    def clock(self) -> float:
        return self.now

    def waited(self) -> float | None:
        return self.queued


def test_a_tick_is_held_for_its_lag_less_its_wait_for_a_cpu() -> None:
    registry, fake = CollectorRegistry(), Clocks()
    watch = LoopWatch(registry, interval_s=0.01, clock=fake.clock, waited=fake.waited)
    # woke 0.31 s after it began (0.3 s late), 0.24 s of which the thread waited to run
    fake.now, fake.queued = 10.31, 1.24
    lag, held = watch.tick(10.0, 1.0)
    assert lag == pytest.approx(0.30)
    assert held == pytest.approx(0.06)
    assert counts(registry, "pdd_router_event_loop_lag_seconds")["0.25"] == 0
    assert counts(registry, "pdd_router_event_loop_lag_seconds")["0.5"] == 1
    assert counts(registry, "pdd_router_event_loop_held_seconds")["0.05"] == 0
    assert counts(registry, "pdd_router_event_loop_held_seconds")["0.1"] == 1


def test_without_the_kernels_figure_the_whole_lag_is_held() -> None:
    fake = Clocks()
    watch = LoopWatch(CollectorRegistry(), interval_s=0.01, clock=fake.clock, waited=fake.waited)
    fake.now, fake.queued = 10.21, None
    assert watch.tick(10.0, None) == pytest.approx((0.2, 0.2))


def test_a_wait_for_a_cpu_longer_than_the_lag_holds_nothing() -> None:
    """Run-queue time counted before the tick's sleep began is not the tick's: held is
    never negative."""
    fake = Clocks()
    watch = LoopWatch(CollectorRegistry(), interval_s=0.01, clock=fake.clock, waited=fake.waited)
    fake.now, fake.queued = 10.05, 1.5
    assert watch.tick(10.0, 1.0) == pytest.approx((0.04, 0.0))


def test_a_callback_that_blocks_the_loop_is_seen_held() -> None:
    """A real loop: a callback sleeps 0.3 s in a blocking call (its thread waits for no
    CPU), and a tick sees the loop held at least 0.25 s, however busy the machine."""
    registry = CollectorRegistry()
    watch = LoopWatch(registry, interval_s=0.01)

    async def scenario() -> None:
        task = asyncio.create_task(watch.run())
        await asyncio.sleep(0.05)
        time.sleep(0.3)  # the blocking call, on the loop
        await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    held = counts(registry, "pdd_router_event_loop_held_seconds")
    assert held["+Inf"] - held["0.25"] >= 1, held


def test_the_kernel_reports_the_threads_wait_for_a_cpu() -> None:
    """On Linux with scheduler statistics, a figure that only grows."""
    first = runqueue_wait_s()
    if first is None:
        pytest.skip("this kernel does not report run-queue waits")
    second = runqueue_wait_s()
    assert second is not None
    assert second >= first >= 0


def test_a_tick_needs_a_positive_interval() -> None:
    with pytest.raises(ValueError, match="interval_s must be positive, got 0"):
        LoopWatch(CollectorRegistry(), interval_s=0)

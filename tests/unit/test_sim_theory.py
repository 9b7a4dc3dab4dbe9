"""The simulator's queue and link against queueing theory: exact latency, M/D/1, M/M/1-PS."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

from replay.sim.event_loop import EventLoop
from replay.sim.events import Priority
from replay.sim.link import Link, Transfer
from replay.sim.prefill_queue import PrefillQueue


def _starts(link: Link, size: float, done: list[Transfer]) -> Callable[[object], None]:
    """An event handler that starts one transfer on ``link``, finished into ``done``."""

    def start(_: object) -> None:
        link.start(size, done.append)

    return start


def test_an_isolated_transfer_takes_half_the_rtt_plus_bytes_over_bandwidth() -> None:
    loop = EventLoop()
    bandwidth = 20e9 / 8  # 20 Gbps in bytes per second
    link = Link(loop, "wan", bandwidth, rtt_s=0.03)
    done: list[Transfer] = []
    loop.at(5.0, Priority.ARRIVAL, _starts(link, 3.5e9, done))
    loop.run()
    assert len(done) == 1
    assert done[0].duration_s == pytest.approx(0.015 + 3.5e9 / bandwidth, rel=1e-12)
    assert link.bytes_sent == 3.5e9


def test_two_equal_transfers_share_the_bandwidth() -> None:
    loop = EventLoop()
    link = Link(loop, "wan", 1e9, rtt_s=0.0)
    done: list[Transfer] = []
    for _ in range(2):
        loop.at(0.0, Priority.ARRIVAL, _starts(link, 1e9, done))
    loop.run()
    assert [t.duration_s for t in done] == [pytest.approx(2.0), pytest.approx(2.0)]


def _poisson(rate: float, n: int, seed: int) -> Iterator[float]:
    rng = np.random.default_rng(seed)
    return iter(np.cumsum(rng.exponential(1.0 / rate, n)).tolist())


@pytest.mark.slow
@pytest.mark.parametrize(("rho", "n"), [(0.5, 300_000), (0.8, 1_000_000)])
def test_prefill_queue_matches_md1_mean_wait(rho: float, n: int) -> None:
    """One server, deterministic service S, Poisson arrivals: W = rho*S / (2(1-rho))."""
    loop = EventLoop()
    service = 1.0
    waits: list[float] = []

    def admit(arrival: float) -> bool:
        waits.append(loop.now - arrival)
        return True

    queue: PrefillQueue[float] = PrefillQueue(
        loop, lambda batch: service, lambda job: None, admit=admit
    )
    arrivals = _poisson(rho / service, n, seed=0)

    def arrive(at: float) -> None:
        following = next(arrivals, None)
        if following is not None:
            loop.at(following, Priority.ARRIVAL, arrive, following)
        queue.submit(at)

    first = next(arrivals)
    loop.at(first, Priority.ARRIVAL, arrive, first)
    loop.run()
    expected = rho * service / (2 * (1 - rho))
    measured = float(np.mean(waits))
    print(f"M/D/1 rho={rho}: mean wait {measured:.4f} s, theory {expected:.4f} s")
    assert len(waits) == n
    assert measured == pytest.approx(expected, rel=0.02)


@pytest.mark.slow
@pytest.mark.parametrize(("rho", "n"), [(0.5, 300_000), (0.8, 500_000)])
def test_link_matches_mm1_processor_sharing_mean_sojourn(rho: float, n: int) -> None:
    """Poisson arrivals, exponential sizes, equal shares: T = S / (1 - rho)."""
    loop = EventLoop()
    bandwidth, mean_bytes = 1e9, 1e8
    service = mean_bytes / bandwidth
    link = Link(loop, "wan", bandwidth, rtt_s=0.0)
    sojourns: list[float] = []

    def done(transfer: Transfer) -> None:
        assert transfer.duration_s is not None
        sojourns.append(transfer.duration_s)

    rng = np.random.default_rng(1)
    sizes = iter(rng.exponential(mean_bytes, n).tolist())
    arrivals = _poisson(rho / service, n, seed=2)

    def arrive(size: float) -> None:
        following = next(arrivals, None)
        if following is not None:
            loop.at(following, Priority.ARRIVAL, arrive, next(sizes))
        link.start(size, done)

    loop.at(next(arrivals), Priority.ARRIVAL, arrive, next(sizes))
    loop.run()
    expected = service / (1 - rho)
    measured = float(np.mean(sojourns))
    print(f"M/M/1-PS rho={rho}: mean sojourn {measured:.4f} s, theory {expected:.4f} s")
    assert len(sojourns) == n
    assert measured == pytest.approx(expected, rel=0.02)

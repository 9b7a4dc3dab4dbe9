"""Capacity at steady state on a cluster computable by hand: one server, fixed service time.

Arrivals evenly spaced at rate R, each served in ``S`` seconds, FIFO: below ``1 / S`` no
request waits (TTFT = S); above it each request waits ``S - 1 / R`` more than the last,
so past the warm-up every request misses a TTFT threshold just above ``S``. The
capacity is ``1 / S`` = 4 req/s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import pytest

from replay.experiments.capacity import CapacitySettings, WindowedAttainment, find_capacity
from replay.experiments.steady_replay import SteadyMeasure, SteadyWindow
from replay.metrics.record import RequestRecord
from replay.metrics.summary import SlaThresholds
from replay.trace.record import TraceRequest

SERVICE_S = 0.25
SLA = SlaThresholds(ttft_s=0.26, tpot_s=1.0)


@dataclass(frozen=True)
class Outcome:  # the fields the measure reads of a request record
    arrival_s: float
    ttft_s: float
    tpot_s: float | None
    e2e_s: float


def one_server(
    requests: Sequence[TraceRequest], rate_scale: float, seed: int
) -> Sequence[RequestRecord]:
    free, out = 0.0, []
    for r in sorted(requests, key=lambda r: r.arrival_s):
        arrival = r.arrival_s / rate_scale
        free = max(free, arrival) + SERVICE_S
        out.append(Outcome(arrival, free - arrival, None, free - arrival))
    return cast(Sequence[RequestRecord], out)


TRACE = [TraceRequest(i, float(i), 100, 1, (i,), 16) for i in range(40)]  # 1 req/s, 40 s


def measure(window: SteadyWindow | None = None) -> SteadyMeasure:
    return SteadyMeasure(TRACE, one_server, SLA, window or SteadyWindow())


def test_capacity_of_one_server_is_one_over_its_service_time() -> None:
    settings = CapacitySettings(tolerance=0.02, seeds=(0, 1), start_req_s=1.0)
    result = find_capacity(measure(), settings)
    assert 4.0 * (1 - 0.02) <= result.capacity_req_s <= 4.0
    assert result.capacity_low_req_s <= result.capacity_req_s <= result.capacity_high_req_s
    assert result.capacity_high_req_s <= 4.0
    assert result.sla_goodput_req_s == pytest.approx(result.capacity_req_s)  # all met there
    assert result.bracketed
    assert result.monotone


def test_probes_bisect_to_the_tolerance() -> None:
    settings = CapacitySettings(tolerance=0.02, seeds=(0,), start_req_s=1.0)
    result = find_capacity(measure(), settings)
    rates = [p.rate_req_s for p in result.probes]
    assert rates[:4] == [1.0, 2.0, 4.0, 8.0]  # bracketed by doubling
    passing = max(p.rate_req_s for p in result.probes if p.passed)
    failing = min(p.rate_req_s for p in result.probes if not p.passed)
    assert (failing - passing) / passing <= 0.02


def test_a_short_trace_is_tiled_and_says_so() -> None:
    result = find_capacity(measure(), CapacitySettings(seeds=(0,)))
    # a copy lasts 10 s at 4 req/s (40 trace seconds a period); 360 s need 36 copies
    near = max((p for p in result.probes if p.passed), key=lambda p: p.rate_req_s)
    assert near.windows.copies == 36
    assert sum(near.windows.total) == pytest.approx(300 * near.rate_req_s, abs=2)
    assert any("too short" in w and "tiled 36 times" in w for w in result.warnings)


def test_the_warm_up_is_left_out() -> None:
    window = SteadyWindow(warmup_s=20.0, window_s=100.0, windows=4, tail_s=0.0)
    got = measure(window)(2.0, 0)
    assert sum(got.total) == 200  # 100 s at 2 req/s; the 40 warm-up arrivals left out
    assert got.total == (50, 50, 50, 50)


def test_attainment_rising_with_the_rate_is_warned() -> None:
    def bumpy(rate_req_s: float, seed: int) -> WindowedAttainment:
        met = 95 if rate_req_s < 3 else 70 if rate_req_s < 5 else 85 if rate_req_s < 7 else 10
        return WindowedAttainment(met=(met, met), total=(100, 100))

    settings = CapacitySettings(seeds=(0,), start_req_s=6.0, tolerance=0.05)
    result = find_capacity(bumpy, settings)  # 85% at 6 req/s, then 70% at 3
    assert [p.rate_req_s for p in result.probes][:2] == [6.0, 3.0]
    assert not result.monotone
    assert any("not monotone" in w for w in result.warnings)


def test_a_cluster_that_never_fails_gives_a_lower_bound() -> None:
    def easy(rate_req_s: float, seed: int) -> WindowedAttainment:
        return WindowedAttainment(met=(10, 10), total=(10, 10))

    result = find_capacity(easy, CapacitySettings(seeds=(0,), max_probes=4))
    assert not result.bracketed
    assert result.capacity_req_s == 8.0
    assert any("lower bound" in w for w in result.warnings)


def test_a_rise_across_probes_that_are_not_neighbours_is_warned() -> None:
    def creeping(rate_req_s: float, seed: int) -> WindowedAttainment:
        met = 80 if rate_req_s < 2 else 84 if rate_req_s < 4 else 88  # +4 points a step
        return WindowedAttainment(met=(met, met), total=(100, 100))

    settings = CapacitySettings(seeds=(0,), start_req_s=6.0, floor_req_s=1.5)
    result = find_capacity(creeping, settings)  # 88% at 6, 84% at 3, 80% at 1.5
    assert [p.rate_req_s for p in result.probes] == [6.0, 3.0, 1.5]
    assert not result.monotone  # no neighbour rises by 5 points, 1.5 -> 6 rises by 8
    assert any("80.0% at 1.500 req/s but 88.0% at 6.000" in w for w in result.warnings)


def test_an_interval_bound_below_the_probed_rates_is_marked_extrapolated() -> None:
    def one_bad_window(rate_req_s: float, seed: int) -> WindowedAttainment:
        met = (100, 85) if rate_req_s < 1.5 else (0, 0)  # 92.5% at 1 req/s, a window of 85%
        return WindowedAttainment(met=met, total=(100, 100))

    settings = CapacitySettings(seeds=(0,), start_req_s=1.0, tolerance=0.6)
    result = find_capacity(one_bad_window, settings)
    assert [p.rate_req_s for p in result.probes] == [1.0, 2.0, 1.5]
    # a quarter of the draws pick the 85% window twice: 85% at 1, 0% at 1.5, so the
    # crossing of 90% is extrapolated to 1 + (0.90 - 0.85) / (0 - 0.85) x 0.5 = 0.970588
    assert result.capacity_low_req_s == pytest.approx(0.970588, abs=1e-6)
    assert result.interval_extrapolated
    assert any("extrapolated" in w for w in result.warnings)
    assert not find_capacity(measure(), CapacitySettings(seeds=(0,))).interval_extrapolated


def test_a_bound_on_a_probed_rate_is_not_extrapolated_however_it_is_rounded() -> None:
    def third(rate_req_s: float, seed: int) -> WindowedAttainment:
        met = (10, 10) if rate_req_s < 0.5 else (0, 0)
        return WindowedAttainment(met=met, total=(10, 10))

    settings = CapacitySettings(seeds=(0,), start_req_s=1 / 3, tolerance=1.0)
    result = find_capacity(third, settings)  # passes at 1/3, fails at 2/3
    assert result.capacity_low_req_s == result.capacity_high_req_s == 0.333333
    assert not result.interval_extrapolated
    assert result.warnings == []


# dense then sparse: 20 requests 0.5 s apart, then 20 requests 2 s apart (trace seconds)
UNEVEN = [TraceRequest(i, 0.5 * i if i < 20 else 10.0 + 2.0 * (i - 20), 100, 1, (i,), 16)
          for i in range(40)]  # fmt: skip


def test_two_seeds_judge_different_stretches_of_the_trace_and_seed_zero_the_trace_as_is() -> None:
    seen: dict[int, list[TraceRequest]] = {}

    def recording(
        requests: Sequence[TraceRequest], rate_scale: float, seed: int
    ) -> Sequence[RequestRecord]:
        seen[seed] = list(requests)
        return one_server(requests, rate_scale, seed)

    steady = SteadyMeasure(UNEVEN, recording, SLA, SteadyWindow())
    zero, one = steady(2.5, 0), steady(2.5, 1)
    assert [r.arrival_s for r in seen[0][:40]] == [r.arrival_s for r in UNEVEN]
    # period 48 + 48 / 39; seed 1's phase 0.618 cuts at 30.43 s: it starts at request 31
    assert [r.request_id for r in seen[1][:2]] == [31, 32]
    assert zero.total != one.total or zero.met != one.met

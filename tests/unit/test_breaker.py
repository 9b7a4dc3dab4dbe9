"""Circuit breakers: which failures take an instance out, and how it comes back."""

from __future__ import annotations

from router.service.breaker import BreakerState, CircuitBreakers


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def breakers() -> tuple[CircuitBreakers, Clock, list[tuple[str, bool]]]:
    clock = Clock()
    changes: list[tuple[str, bool]] = []
    cb = CircuitBreakers(
        failures_to_open=3,
        open_s=2.0,
        max_open_s=5.0,
        clock=clock,
        on_change=lambda iid, ok: changes.append((iid, ok)),
    )
    return cb, clock, changes


def test_failures_in_a_row_open_it_and_a_success_between_resets_the_count() -> None:
    cb, _, changes = breakers()
    cb.failure("md0")
    cb.failure("md0")
    cb.success("md0")
    cb.failure("md0")
    cb.failure("md0")
    assert cb.allows("md0")
    cb.failure("md0")
    assert not cb.allows("md0")
    assert changes == [("md0", False)]


def test_a_refused_connection_opens_it_at_once() -> None:
    cb, _, _ = breakers()
    cb.failure("p0", unreachable=True)
    assert cb.state("p0") is BreakerState.OPEN


def test_a_probe_after_the_open_time_lets_requests_try_again() -> None:
    cb, clock, changes = breakers()
    cb.failure("md0", unreachable=True)
    clock.now = 1.9
    cb.probe("md0", ok=True)
    assert not cb.allows("md0")  # too early: still out
    clock.now = 2.0
    cb.probe("md0", ok=True)
    assert cb.state("md0") is BreakerState.HALF_OPEN
    assert cb.allows("md0")
    cb.success("md0")
    assert cb.state("md0") is BreakerState.CLOSED
    assert changes == [("md0", False), ("md0", True)]


def test_a_failed_try_keeps_it_out_twice_as_long_up_to_the_cap() -> None:
    cb, clock, _ = breakers()
    cb.failure("md0", unreachable=True)  # out for 2 s
    clock.now = 2.0
    cb.probe("md0", ok=True)
    cb.failure("md0")  # the trial request failed: out for 4 s
    assert cb.state("md0") is BreakerState.OPEN
    clock.now = 5.9
    cb.probe("md0", ok=True)
    assert not cb.allows("md0")
    clock.now = 6.0
    cb.probe("md0", ok=True)
    cb.failure("md0")  # out for min(8, 5) s
    clock.now = 10.9
    cb.probe("md0", ok=True)
    assert not cb.allows("md0")
    clock.now = 11.0
    cb.probe("md0", ok=True)
    assert cb.allows("md0")


def test_failed_probes_count_and_successful_ones_do_not_clear_request_failures() -> None:
    cb, _, _ = breakers()
    cb.probe("rld0", ok=False)
    cb.probe("rld0", ok=False)
    cb.probe("rld0", ok=False)
    assert not cb.allows("rld0")  # a hung engine: three probes timed out
    cb.failure("md0")
    cb.probe("md0", ok=True)  # it answers probes ...
    cb.failure("md0")
    cb.probe("md0", ok=True)
    cb.failure("md0")  # ... and fails every request
    assert not cb.allows("md0")


def test_instances_are_independent_and_forgotten_on_removal() -> None:
    cb, _, _ = breakers()
    cb.failure("md0", unreachable=True)
    assert cb.allows("md1")
    cb.forget("md0")
    assert cb.allows("md0")

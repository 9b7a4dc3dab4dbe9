"""Circuit breakers: which engine instances requests may go to, from what they did lately.

One breaker per instance. Closed, it serves. Failures held against the instance (a
timeout, a 5xx, a broken stream, a failed health probe; never a request the engine
refused as the client's mistake) count up; ``failures_to_open`` in a row open it, and
a connection that cannot be made opens it at once. Open, no request goes there for
``open_s``; after that the next successful health probe half-opens it: requests may go
there again and the first outcome decides, success closing it, failure opening it for
twice as long (at most ``max_open_s``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from router.index.base import Clock

__all__ = ["BreakerState", "CircuitBreakers"]


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@dataclass(slots=True)
class _Breaker:
    state: BreakerState = BreakerState.CLOSED
    failures: int = 0
    opened_at: float = 0.0
    open_s: float = 0.0


class CircuitBreakers:
    """The breakers of a pool's instances; ``on_change(instance, allowed)`` is told when an
    instance starts or stops taking requests."""

    def __init__(
        self,
        *,
        failures_to_open: int = 3,
        open_s: float = 2.0,
        max_open_s: float = 30.0,
        clock: Clock = time.monotonic,
        on_change: Callable[[str, bool], None] | None = None,
    ) -> None:
        self.failures_to_open = failures_to_open
        self.open_s = open_s
        self.max_open_s = max_open_s
        self._clock = clock
        self.on_change = on_change
        self._breakers: dict[str, _Breaker] = {}

    def _get(self, instance_id: str) -> _Breaker:
        breaker = self._breakers.get(instance_id)
        if breaker is None:
            breaker = self._breakers[instance_id] = _Breaker()
        return breaker

    def state(self, instance_id: str) -> BreakerState:
        return self._get(instance_id).state

    def allows(self, instance_id: str) -> bool:
        """Whether requests may go to the instance now."""
        return self._get(instance_id).state is not BreakerState.OPEN

    def forget(self, instance_id: str) -> None:
        self._breakers.pop(instance_id, None)

    def success(self, instance_id: str) -> None:
        """A request (or a step of one) succeeded on the instance."""
        breaker = self._get(instance_id)
        breaker.failures = 0
        if breaker.state is BreakerState.HALF_OPEN:
            breaker.state = BreakerState.CLOSED
            breaker.open_s = 0.0

    def failure(self, instance_id: str, *, unreachable: bool = False) -> None:
        """A failure held against the instance; ``unreachable``: no connection could be made."""
        breaker = self._get(instance_id)
        breaker.failures += 1
        if breaker.state is BreakerState.OPEN:
            return
        trial_failed = breaker.state is BreakerState.HALF_OPEN
        if unreachable or trial_failed or breaker.failures >= self.failures_to_open:
            self._open(instance_id, breaker, longer=trial_failed)

    def probe(self, instance_id: str, ok: bool) -> None:
        """A health probe's result: a failure counts like a request's; a success after the
        open time lets requests try the instance again (it does not clear the failures of
        requests: an engine can answer probes and fail every request)."""
        if not ok:
            self.failure(instance_id)
            return
        breaker = self._get(instance_id)
        rested = self._clock() - breaker.opened_at >= breaker.open_s
        if breaker.state is BreakerState.OPEN and rested:
            breaker.state = BreakerState.HALF_OPEN
            breaker.failures = 0
            if self.on_change is not None:
                self.on_change(instance_id, True)

    def _open(self, instance_id: str, breaker: _Breaker, *, longer: bool) -> None:
        breaker.state = BreakerState.OPEN
        breaker.opened_at = self._clock()
        base = breaker.open_s * 2 if longer and breaker.open_s > 0 else self.open_s
        breaker.open_s = min(base, self.max_open_s)
        if self.on_change is not None:
            self.on_change(instance_id, False)

"""The sweep's search over ``--rate-scale``, and the speculative plan that runs it on W workers.

``Bisection`` is the search of ``replay sweep`` as a state machine: ``next_scale(state)`` is
the next probe (None: done) and ``advance(state, ...)`` takes a probe's outcome (passed or
not). From the start scale it doubles (or halves) until one probe passes and one fails, then
bisects until the bracket is within ``tolerance`` (relative) or ``max_probes`` have run.

Each probe depends on the last one's outcome, so the search is a path down a binary tree of
possible probes. ``speculate(rules, state, W)`` picks the W probes to replay at once: the
next one and those after it on either outcome, nearest first (breadth-first; between two
at the same depth, the one after a pass first). The sweep then walks the path the real
outcomes take through them, so its probes are exactly the serial search's; what is off
the path is discarded. With W = 2^d - 1 workers a round of one replay's time advances the
path by d = log2(W + 1) probes: W = 1 is the serial search, W = 3 twice as fast, W = 7
three times, W = 15 four times (a sweep of 8 probes then takes two rounds). A W between
those fills part of the next level: W = 2 advances 1.5 probes a round on average (the
second probe is on the path half the time). These are the ratios of rounds; the wall time
also depends on the cores (W replays need W cores) and on the slowest replay of a round.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["MAX_DOUBLINGS", "Bisection", "SearchState", "speculate"]

MAX_DOUBLINGS = 10


@dataclass(frozen=True, slots=True)
class SearchState:
    """Where the search stands: probes run, the bracket, the bracketing step and scale."""

    probes: int = 0
    low: float | None = None  # highest passing rate scale
    high: float | None = None  # lowest failing rate scale
    step: float = 2.0  # doubling after a first pass, halving after a first failure
    scale: float = 0.0  # the last bracketing probe's scale
    doublings: int = 0


@dataclass(frozen=True, slots=True)
class Bisection:
    """The rules of the search (start scale, tolerance, most probes)."""

    start: float
    tolerance: float
    max_probes: int

    def next_scale(self, state: SearchState) -> float | None:
        """The next probe's rate scale, or None when the search is over."""
        if state.probes == 0:
            return self.start
        if state.probes >= self.max_probes:
            return None
        if state.low is None or state.high is None:
            return state.scale * state.step if state.doublings < MAX_DOUBLINGS else None
        if (state.high - state.low) / state.low > self.tolerance:
            return (state.low + state.high) / 2.0
        return None

    def advance(
        self, state: SearchState, scale: float, rate_scale: float, passed: bool
    ) -> SearchState:
        """The state after probing ``scale`` (its replay's ``rate_scale``) with this outcome."""
        first = state.probes == 0
        bracketing = not first and (state.low is None or state.high is None)
        return SearchState(
            probes=state.probes + 1,
            low=rate_scale if passed else state.low,
            high=state.high if passed else rate_scale,
            step=(2.0 if passed else 0.5) if first else state.step,
            scale=scale if first or bracketing else state.scale,
            doublings=state.doublings + 1 if bracketing else state.doublings,
        )


def speculate(rules: Bisection, state: SearchState, width: int) -> list[float]:
    """Up to ``width`` rate scales to replay now: the next probe first, then the probes that
    follow it on either outcome, breadth-first (see the module docstring)."""
    chosen: list[float] = []
    queue = deque([state])
    while queue and len(chosen) < width:
        node = queue.popleft()
        scale = rules.next_scale(node)
        if scale is None:
            continue
        if scale not in chosen:
            chosen.append(scale)
        for passed in (True, False):
            queue.append(rules.advance(node, scale, scale, passed))
    return chosen

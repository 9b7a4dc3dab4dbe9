"""An instance's decode batch as a fluid: every running request gains a token per step.

Instead of one event per decode step, the batch is a processor-sharing process
whose members all advance at ``1 / step_time(batch size, total context)`` tokens
per second. The step time is re-evaluated whenever membership changes (with the
context generated so far), and only the next completion has an event. The largest
step time a request lived through (its largest inter-token gap inside this batch)
comes from a monotonic stack of step times: O(log n) per query.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable

from replay.sim.event_loop import EventLoop
from replay.sim.events import Priority
from replay.sim.shared_progress import SharedProgress

__all__ = ["DecodeBatch"]


class DecodeBatch(SharedProgress):
    """Continuous batching of decode on one instance, in fluid form."""

    __slots__ = (
        "_ctx0",
        "_gap_steps",
        "_gap_times",
        "_held_until",
        "_joined",
        "_on_finish",
        "_step_s",
        "_sum_ctx0",
        "gap_at_exit",
    )

    def __init__(
        self,
        loop: EventLoop,
        step_s: Callable[[int, float], float],
        on_finish: Callable[[int], None],
    ) -> None:
        """``step_s(batch, context tokens)``: one step's time (``StepCosts.decode_step_s``, or
        a colocated engine's step with its prefill chunk)."""
        super().__init__(loop, Priority.DECODE)
        self._step_s = step_s
        self._on_finish = on_finish
        self._ctx0: dict[int, float] = {}
        self._sum_ctx0 = 0.0
        # step times since the start, decreasing from bottom to top (monotonic stack)
        self._gap_times: list[float] = []
        self._gap_steps: list[float] = []
        self._joined: dict[int, float] = {}
        self.gap_at_exit: dict[int, float] = {}  # key -> largest step it lived through
        self._held_until = float("-inf")

    def join(self, key: int, tokens: float, context_tokens: float) -> None:
        """A request starts decoding ``tokens`` tokens on top of ``context_tokens`` of KV."""
        self._ctx0[key] = context_tokens
        self._sum_ctx0 += context_tokens
        self._joined[key] = self._loop.now
        self.add(key, tokens)

    def leave(self, key: int) -> float:
        """A request stops before its end (handoff); returns the tokens it generated.

        The largest step it lived through is left in ``gap_at_exit[key]`` (pop it)."""
        return self.remove(key)

    def context_tokens(self) -> float:
        return self._sum_ctx0 + self.total_progress()

    def contexts(self) -> list[tuple[int, float]]:
        """Each member's key and context tokens, now."""
        self.advance()
        v, ctx0 = self.v, self._ctx0
        return [(key, ctx0[key] + v - start) for key, (start, _) in self._members.items()]

    def step_s(self) -> float:
        """The current step time (0 when idle); during a hold, a step's as the batch stands."""
        if self.rate > 0.0:
            return 1.0 / self.rate
        n = len(self._members)
        return self._step_s(n, self._sum_ctx0 + n * self.v - self._sum_start) if n else 0.0

    def max_step_since(self, time: float) -> float:
        """Largest step time in force at any moment from ``time`` until now."""
        i = bisect_left(self._gap_times, time)
        return self._gap_steps[i] if i < len(self._gap_steps) else self.step_s()

    # -- hooks ------------------------------------------------------------------------

    @property
    def held_until(self) -> float:
        """When the hold in force ends (-inf or a past time when none is)."""
        return self._held_until

    def hold(self, seconds: float) -> float:
        """No member advances for ``seconds`` from now (from the end of a hold in force):
        a pass doing other work (a joining request's prefill) delays every member's next
        token. Returns when the hold ends; ``release`` then (the caller schedules it). The
        members' gap then is the hold and a step, from now."""
        now = self._loop.now
        self._held_until = max(self._held_until, now) + seconds
        self.refresh()
        self._push_gap(self._held_until - now + self.step_s())
        return self._held_until

    def release(self) -> None:
        """A hold may have ended: the members advance again once the last one has."""
        if self._loop.now >= self._held_until:
            self.refresh()

    def _compute_rate(self) -> float:
        if self._loop.now < self._held_until:
            return 0.0
        n = len(self._members)
        context = self._sum_ctx0 + n * self.v - self._sum_start
        return 1.0 / self._step_s(n, context)

    def _rate_changed(self, rate: float) -> None:
        if rate > 0.0:
            self._push_gap(1.0 / rate)

    def _push_gap(self, step: float) -> None:
        """A gap between tokens in force from now (the stack keeps the largest since)."""
        times, steps = self._gap_times, self._gap_steps
        while steps and steps[-1] <= step:
            steps.pop()
            times.pop()
        times.append(self._loop.now)
        steps.append(step)

    def _detach(self, key: int) -> None:
        self.gap_at_exit[key] = self.max_step_since(self._joined.pop(key))
        self._sum_ctx0 -= self._ctx0.pop(key)
        if not self._ctx0:
            self._sum_ctx0 = 0.0

    def _completed(self, key: int) -> None:
        self._on_finish(key)

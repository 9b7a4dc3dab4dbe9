"""What a finished request did: metrics, session history, experiment arms, the log line.

The request path (``router.service.generation``) times what the client received
(``Timing``), has the ``OutcomeRecorder`` watch the request's chain for KV events while it
runs (``watch``; a request that fails stops being watched, ``unwatched_on_error``), and
hands it the end (``record``):

- at once: the session's output length (its next turn sees it), the TTFT metric and the
  experiment arm's outcome;
- then the decision log's outcome line with the realized hit: the engine's ``usage``
  (cached prompt tokens), else the instance's KV events (``KVRealizations``). Engines
  publish KV events asynchronously, so when a serving instance publishes them the line
  waits ``service.kv_events_grace_s`` for the request's last stored events (also the
  ``events_hit`` cross-check of a usage hit); lines still waiting at shutdown are
  written then (``Deferred.flush``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

from policies.tiers import Tier
from policies.types import Decision, RequestView
from router.predictor.outcome import DecisionOutcome, OutcomeSource
from router.predictor.realization import KVRealizations
from router.scheduler import Scheduler
from router.service.deferred import Deferred
from router.service.experiments import Arm, ArmSample
from router.service.index_lane import IndexLane
from router.service.metrics import ServiceMetrics
from router.service.pipelines.upstream import ExecutionResult

__all__ = ["OutcomeRecorder", "Timing"]


@dataclass(slots=True)
class Timing:
    """When the client got its tokens, for TTFT and TPOT."""

    started: float
    first_at: float | None = None
    last_at: float | None = None
    tokens: int = 0

    def saw(self, n: int) -> None:
        now = time.perf_counter()
        if self.first_at is None and n:
            self.first_at = now
        if n:
            self.last_at = now
        self.tokens += n


@dataclass(frozen=True, slots=True)
class _Realized:
    tier: Tier
    hit: float
    source: OutcomeSource
    events_hit: float | None  # from KV events too, when usage gave ``hit``


def _served(outcome: ExecutionResult) -> Tier | None:
    """The decode tier that finished the request (MD, else RLD)."""
    return next((t for t in (Tier.MD, Tier.RLD) if t.value in outcome.instances), None)


@dataclass(slots=True)
class OutcomeRecorder:
    """Records finished requests (the module docstring says what, when); ``scheduler``:
    the default one, an experiment arm's own for the arm's requests."""

    scheduler: Scheduler
    lane: IndexLane
    metrics: ServiceMetrics
    deferred: Deferred
    realizations: KVRealizations | None = None  # with a decision log: hits from KV events
    grace_s: float = 0.0  # how long an outcome line waits for late KV events

    def watch(self, view: RequestView, decision: Decision) -> None:
        """With a decision log, watch the request's chain on its decode instances: the
        realized hit when the engine's usage reports no cached tokens (a retry replaces
        the watch)."""
        if self.realizations is None or view.request_id is None:
            return
        decode = [i for i in (decision.md_instance, decision.rld_instance) if i is not None]
        self.realizations.begin(view.request_id, decode, view.chain,
                                block_size=view.block_size,
                                prompt_tokens=view.input_length)  # fmt: skip

    def unwatch(self, request_id: str) -> None:
        if self.realizations is not None:
            self.realizations.forget(request_id)

    @contextlib.contextmanager
    def unwatched_on_error(self, request_id: str) -> Iterator[None]:
        """A request that fails writes no outcome: stop watching it."""
        try:
            yield
        except BaseException:
            self.unwatch(request_id)
            raise

    def _realized(self, request_id: str, outcome: ExecutionResult, prompt: int) -> _Realized | None:
        """The decode tier that served the request and its realized hit there: the cached
        tokens in the engine's usage, else read from its KV events (the request is no longer
        watched). After a handoff MD's usage counts the prompt its warm-up copy brought in,
        not what it held before, so only its KV events tell."""
        watched = self.realizations.finish(request_id) if self.realizations is not None else {}
        served = _served(outcome)
        if served is None:
            return None
        from_events = watched.get(outcome.instances[served.value])
        if outcome.cached_tokens is not None and outcome.handoff is None:
            hit = min(outcome.cached_tokens, prompt) / prompt if prompt else 0.0
            return _Realized(served, hit, "usage", from_events)
        return None if from_events is None else _Realized(served, from_events, "kv-events", None)

    def _waits_for_events(self, request_id: str, outcome: ExecutionResult) -> bool:
        """Whether the outcome line should wait for late KV events: the request is watched
        and an instance that served it publishes KV events."""
        realizations = self.realizations
        if realizations is None or request_id not in realizations:
            return False
        return any(realizations.heard(outcome.instances[t.value]) for t in (Tier.MD, Tier.RLD)
                   if t.value in outcome.instances)  # fmt: skip

    def record(
        self,
        view: RequestView,
        decision: Decision,
        outcome: ExecutionResult,
        arm: Arm | None,
        timing: Timing,
    ) -> None:
        """A request finished: see the module docstring for what is recorded when."""
        assert view.request_id is not None
        request_id = view.request_id
        finished_s = time.time()
        scheduler = arm.scheduler if arm is not None else self.scheduler
        self.lane.submit(scheduler.record_output, view.session_id, timing.tokens)
        arm_outcome: ArmSample | None = None
        if timing.first_at is not None:
            assert timing.last_at is not None
            ttft = timing.first_at - timing.started
            tokens = timing.tokens
            tpot = (timing.last_at - timing.first_at) / (tokens - 1) if tokens > 1 else None
            self.metrics.overhead.observe(max(ttft - outcome.engine_wait_s, 0.0))
            if arm is not None:
                arm_outcome = ArmSample(ttft, tpot, outcome.pipeline.value, None)
                arm.record(arm_outcome)

        def line() -> None:
            self._log_outcome(view, decision, outcome, scheduler, timing, finished_s, arm_outcome)

        grace = self.grace_s
        if grace > 0 and self._waits_for_events(request_id, outcome):
            self.deferred.defer(grace, line)
        else:
            line()

    def _log_outcome(
        self,
        view: RequestView,
        decision: Decision,
        outcome: ExecutionResult,
        scheduler: Scheduler,
        timing: Timing,
        finished_s: float,
        arm_outcome: ArmSample | None,
    ) -> None:
        """The realized hit, the prediction-error metric and the decision log's outcome line."""
        assert view.request_id is not None
        request_id, prompt = view.request_id, view.input_length
        realized = self._realized(request_id, outcome, prompt)
        hits: dict[Tier, float] = {}
        source: OutcomeSource | None = None
        events_hit: dict[Tier, float] | None = None
        if realized is not None:
            served, source = realized.tier, realized.source
            hits[served] = realized.hit
            if realized.events_hit is not None:
                events_hit = {served: realized.events_hit}
            predicted = decision.predicted_hit.get(served)
            if predicted is not None and prompt:
                error = abs(predicted - realized.hit)
                self.metrics.prediction_error.observe(error)
                self.metrics.predicted_hit.observe(predicted)
                if arm_outcome is not None:
                    arm_outcome.prediction_error = error
        first = timing.first_at
        scheduler.log_outcome(
            DecisionOutcome(
                request_id=request_id,
                session_id=view.session_id,
                realized_hit=hits,
                instances={Tier(tier): iid for tier, iid in outcome.instances.items()},
                output_tokens=timing.tokens,
                ttft_s=None if first is None else round(first - timing.started, 6),
                pipeline=outcome.pipeline.value,
                finished_s=finished_s,
                source=source,
                events_hit=events_hit,
            )
        )

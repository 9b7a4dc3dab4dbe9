"""The one way to build a Scheduler: the parts every scheduler of one router shares.

The live service, each arm of an online experiment, the replay and the benchmarks all
build their schedulers here, so a setting that changes how the router decides (a
trained hit-rate model, approximate mode, the decision log) reaches every one of them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from policies.base import Policy
from policies.registry import build_policy, parse_policy
from router.index.base import Clock, PrefixIndex
from router.predictor.tracking import TrackedIndex
from router.scheduler import HitPredictor, Scheduler

__all__ = ["SchedulerFactory"]


@dataclass(frozen=True, slots=True)
class SchedulerFactory:
    """The index and the decision settings shared by every scheduler of one router.

    Build it with ``create``: a model or a decision log needs to know when each block
    was stored, so the index is then wrapped in a ``TrackedIndex`` (``index`` is the
    wrapped one; give it to whatever feeds the index, too).
    """

    index: PrefixIndex
    predictor: HitPredictor | None = None
    record_routes: bool = False
    decision_log: TextIO | None = None
    clock: Clock | None = None

    @classmethod
    def create(
        cls,
        index: PrefixIndex,
        *,
        predictor: HitPredictor | None = None,
        record_routes: bool = False,
        decision_log: TextIO | None = None,
        clock: Clock | None = None,
    ) -> SchedulerFactory:
        """``record_routes`` is approximate mode (the scheduler stores each request's chain
        on the instances it chose); ``predictor`` turns index matches into predicted hits;
        ``clock`` times the index's history and the features (default: wall time)."""
        needs_history = predictor is not None or decision_log is not None
        if needs_history and not isinstance(index, TrackedIndex):
            index = TrackedIndex(index, clock or time.time)
        return cls(index, predictor, record_routes, decision_log, clock)

    def build(
        self,
        policy: Policy | str,
        params: Mapping[str, Any] | None = None,
        *,
        log_fields: Mapping[str, Any] | None = None,
    ) -> Scheduler:
        """A scheduler deciding with ``policy`` (a built policy, or a registered name and its
        ``params``: ValueError naming a bad one). ``log_fields`` are added to every decision
        line (an experiment arm's name)."""
        if isinstance(policy, str):
            policy = build_policy(parse_policy(policy, params))
        scheduler = Scheduler(
            self.index,
            policy,
            decision_log=self.decision_log,
            record_routes=self.record_routes,
            predictor=self.predictor,
            clock=self.clock,
            log_fields=log_fields,
        )
        scheduler.refresh_instances()
        return scheduler

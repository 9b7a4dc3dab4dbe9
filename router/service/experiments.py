"""Online A/B experiments: arms with weights, sticky assignment, outcomes recorded per arm.

Assignment hashes the session id (or, without one, the request's prefix: the block
covering its first 1,024 tokens) to a point in [0, 1) and walks the arms' cumulative
weights, so the same session or prefix always lands in the same arm, on every
router replica, for as long as the experiment runs.
"""

from __future__ import annotations

import hashlib
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from policies.base import Policy
from policies.types import RequestView
from router.scheduler import Scheduler
from router.scheduler_factory import SchedulerFactory

__all__ = [
    "DEFAULT_ARM_SAMPLES",
    "DEFAULT_STOPPED_KEPT",
    "Arm",
    "ArmSample",
    "ArmSpec",
    "Experiment",
    "ExperimentSpec",
    "Experiments",
]

PREFIX_TOKENS = 1024
DEFAULT_ARM_SAMPLES = 50_000  # outcomes an arm keeps for its figures (service.experiment_samples)
DEFAULT_STOPPED_KEPT = 20  # stopped experiments whose reports stay (service.experiments_kept)


class ArmSpec(BaseModel):
    """One arm: a named policy configuration and its share of traffic."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,32}$")
    policy: str = Field(description="A registered policy name (idc-pd, xdc-pd, pdd, ...)")
    params: dict[str, Any] = Field(default_factory=dict)
    weight: float = Field(1.0, gt=0)


class ExperimentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128)
    arms: list[ArmSpec] = Field(min_length=2, max_length=8)

    @model_validator(mode="after")
    def _distinct(self) -> ExperimentSpec:
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arm names must be distinct, got {names}")
        return self


@dataclass(slots=True)
class ArmSample:
    """What one request of an arm did, as the router saw it."""

    ttft_s: float
    tpot_s: float | None
    pipeline: str
    prediction_error: float | None


@dataclass
class Arm:
    """An arm of a running or stopped experiment and what its requests did.

    ``requests`` and ``pipelines`` count every outcome; ``outcomes`` keeps at most
    ``max_samples`` of them, a uniform sample of all the arm's outcomes beyond that
    (reservoir sampling), so an experiment that runs for days holds bounded memory."""

    spec: ArmSpec
    policy: Policy
    scheduler: Scheduler
    max_samples: int = DEFAULT_ARM_SAMPLES
    outcomes: list[ArmSample] = field(default_factory=list)
    requests: int = 0
    pipelines: Counter[str] = field(default_factory=Counter)
    _rng: random.Random = field(default_factory=lambda: random.Random(0), repr=False)

    def record(self, sample: ArmSample) -> None:
        """One request of the arm finished."""
        self.requests += 1
        self.pipelines[sample.pipeline] += 1
        if len(self.outcomes) < self.max_samples:
            self.outcomes.append(sample)
            return
        kept = self._rng.randrange(self.requests)
        if kept < self.max_samples:
            self.outcomes[kept] = sample


@dataclass
class Experiment:
    id: str
    spec: ExperimentSpec
    arms: list[Arm]
    created: float
    status: Literal["running", "stopped"] = "running"
    stopped: float | None = None

    def assign(self, request: RequestView) -> Arm:
        """The arm of this request: sticky by session, else by prompt prefix."""
        if request.session_id is not None:
            key = f"s:{request.session_id}"
        elif request.chain:
            block = min(len(request.chain), max(PREFIX_TOKENS // request.block_size, 1)) - 1
            key = f"p:{request.chain[block]}"
        else:
            key = "p:"
        digest = hashlib.blake2b(f"{self.id}|{key}".encode(), digest_size=8).digest()
        point = int.from_bytes(digest, "big") / 2**64 * sum(a.spec.weight for a in self.arms)
        for arm in self.arms:
            point -= arm.spec.weight
            if point < 0:
                return arm
        return self.arms[-1]


class Experiments:
    """The service's experiments; at most one runs at a time and receives the traffic."""

    def __init__(
        self,
        schedulers: SchedulerFactory,
        *,
        max_samples: int = DEFAULT_ARM_SAMPLES,
        max_stopped: int = DEFAULT_STOPPED_KEPT,
    ) -> None:
        """Arms decide as the service does (``schedulers``: its index, predictor, mode and
        decision log); their decision lines are tagged with the experiment's id and the
        arm's name. Each arm keeps at most ``max_samples`` outcomes (see ``Arm``); the
        reports of the last ``max_stopped`` stopped experiments are kept, older ones are
        forgotten."""
        if max_samples <= 0:
            raise ValueError(f"max_samples must be positive, got {max_samples}")
        if max_stopped < 0:
            raise ValueError(f"max_stopped must be 0 or more, got {max_stopped}")
        self._schedulers = schedulers
        self.max_samples = max_samples
        self.max_stopped = max_stopped
        self.by_id: dict[str, Experiment] = {}

    def create(self, spec: ExperimentSpec) -> Experiment:
        """Start an experiment (ValueError naming the bad arm); stops the running one."""
        experiment_id = uuid.uuid4().hex[:12]
        arms = []
        for arm in spec.arms:
            tags = {"experiment": experiment_id, "arm": arm.name}
            try:
                scheduler = self._schedulers.build(arm.policy, arm.params, log_fields=tags)
            except ValueError as exc:
                raise ValueError(f"arm {arm.name}: {exc}") from exc
            arms.append(Arm(arm, scheduler.policy, scheduler, max_samples=self.max_samples))
        running = self.running()
        if running is not None:
            self.stop(running.id)
        experiment = Experiment(experiment_id, spec, arms, created=time.time())
        self.by_id[experiment.id] = experiment
        return experiment

    def running(self) -> Experiment | None:
        return next((e for e in self.by_id.values() if e.status == "running"), None)

    def stop(self, experiment_id: str) -> Experiment:
        """Stop the experiment: its arms' schedulers forget their sessions and routes (its
        outcomes stay for the report), and the oldest stopped experiments beyond
        ``max_stopped`` are forgotten."""
        experiment = self.by_id[experiment_id]
        if experiment.status == "running":
            experiment.status = "stopped"
            experiment.stopped = time.time()
            for arm in experiment.arms:
                arm.scheduler.release()
            stopped = [e for e in self.by_id.values() if e.status == "stopped"]
            for old in stopped[: max(len(stopped) - self.max_stopped, 0)]:
                if old is not experiment:
                    del self.by_id[old.id]
        return experiment

    def refresh_instances(self) -> None:
        for experiment in self.by_id.values():
            for arm in experiment.arms:
                arm.scheduler.refresh_instances()

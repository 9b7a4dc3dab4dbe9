"""`replay tune`: search a policy's thresholds for the best SLA goodput or BCR on a trace.

Trial 0 is the policy's defaults. The default search is coordinate ascent from them:
one threshold at a time, its other values from the search space (``replay.tune_space``)
are replayed and the best is kept only if it raises the objective by ``min_gain``
(relative), so a tuned configuration moves away from the defaults only where the gain
is worth it (a random search over all thresholds at once, also offered, found configs
that won 1.5% on the trace they were tuned on and lost on another). Each trial is a full
replay; a batch runs in worker processes (``jobs``). The objective is SLA-compliant
goodput or BCR (goodput per cost; the cluster is fixed, so both rank alike unless the
preset changes), ties broken by the lower TTFT P99, then P50. Optionally the best
configuration and the defaults are then both replayed on a second trace, so a tuned
configuration is judged on a trace it was not tuned on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from policies.registry import parse_policy
from replay.metrics.summary import SlaThresholds, Summary
from replay.run import IndexMode, run_replay
from replay.tune_space import draw_trials, space_of
from router.errors import UserError

__all__ = ["CheckResult", "Objective", "Search", "Trial", "TuneResult", "TuneSetup", "run_tune"]

Objective = Literal["goodput", "bcr"]
Search = Literal["coordinate", "random"]


@dataclass(frozen=True, slots=True)
class TuneSetup:
    """Everything a trial's replay needs besides the policy parameters (picklable)."""

    trace: str
    preset: str
    policy: str
    rate_scale: float = 1.0
    seed: int = 0
    overrides: dict[str, Any] = field(default_factory=dict)
    sla: SlaThresholds = field(default_factory=SlaThresholds)
    kv_event_delay_s: float = 0.05
    index_mode: IndexMode = "events"
    predictor: str | None = None


class Trial(BaseModel):
    """One configuration and its figures."""

    number: int
    params: dict[str, Any]  # only what differs from the defaults
    goodput_rps: float
    bcr: float
    sla_attainment: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    wan_bytes: float
    rld_token_share: float
    max_gap_p99_s: float | None

    @classmethod
    def of(cls, number: int, params: Mapping[str, Any], summary: Summary) -> Trial:
        return cls(
            number=number,
            params=dict(params),
            goodput_rps=summary.goodput_rps,
            bcr=summary.bcr,
            sla_attainment=summary.sla_attainment,
            ttft_p50_s=summary.ttft_s.p50,
            ttft_p99_s=summary.ttft_s.p99,
            wan_bytes=summary.wan_bytes,
            rld_token_share=summary.rld_token_share,
            max_gap_p99_s=summary.max_gap_s.p99,
        )

    def score(self, objective: Objective) -> tuple[float, float, float]:
        """Larger is better: the objective, then lower TTFT P99 and P50."""
        value = self.goodput_rps if objective == "goodput" else self.bcr
        inf = float("inf")
        return (round(value, 9), -(self.ttft_p99_s or inf), -(self.ttft_p50_s or inf))


class CheckResult(BaseModel):
    """The defaults and the tuned configuration replayed on another trace."""

    trace: str
    preset: str
    rate_scale: float
    default: Trial
    tuned: Trial


class TuneResult(BaseModel):
    trace: str
    preset: str
    policy: str
    objective: Objective
    search: Search
    rate_scale: float
    seed: int
    trials: list[Trial]
    best: Trial
    check: CheckResult | None = None


def _replay(setup: TuneSetup, params: Mapping[str, Any]) -> Summary:
    return run_replay(
        setup.trace,
        setup.preset,
        setup.policy,
        rate_scale=setup.rate_scale,
        seed=setup.seed,
        policy_params=params,
        overrides=setup.overrides,
        kv_event_delay_s=setup.kv_event_delay_s,
        sla=setup.sla,
        index_mode=setup.index_mode,
        predictor=setup.predictor,
    ).summary


def _trial(job: tuple[TuneSetup, int, dict[str, Any]]) -> Trial:
    setup, number, params = job
    return Trial.of(number, params, _replay(setup, params))


def _run_all(
    jobs: list[tuple[TuneSetup, int, dict[str, Any]]],
    workers: int,
    advance: Callable[[int], None] | None,
) -> list[Trial]:
    done: list[Trial] = []
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            done.append(_trial(job))
            if advance is not None:
                advance(len(done))
        return done
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for trial in pool.map(_trial, jobs):
            done.append(trial)
            if advance is not None:
                advance(len(done))
    return done


class _Runner:
    """Numbers and replays configurations in batches; keeps every trial."""

    def __init__(self, setup: TuneSetup, jobs: int, advance: Callable[[int], None] | None) -> None:
        self.setup = setup
        self.jobs = jobs
        self.advance = advance
        self.trials: list[Trial] = []

    def run(self, configs: list[dict[str, Any]]) -> list[Trial]:
        first = len(self.trials)

        def moved(n: int) -> None:
            if self.advance is not None:
                self.advance(first + n)

        jobs = [(self.setup, first + i, c) for i, c in enumerate(configs)]
        done = _run_all(jobs, self.jobs, moved)
        self.trials.extend(done)
        return done


def _value(trial: Trial, objective: Objective) -> float:
    return trial.goodput_rps if objective == "goodput" else trial.bcr


def _random(runner: _Runner, policy: str, objective: Objective, trials: int, seed: int) -> Trial:
    results = runner.run(draw_trials(policy, trials, seed))
    return max(results, key=lambda t: (t.score(objective), -t.number))


def _coordinate(
    runner: _Runner, policy: str, objective: Objective, trials: int, min_gain: float
) -> Trial:
    """From the defaults, one parameter at a time: replay its other values and keep the
    best only if it raises the objective by ``min_gain`` (relative); repeat until a
    whole pass changes nothing or ``trials`` replays are spent."""
    space = space_of(policy)
    defaults = parse_policy(policy).model_dump(exclude={"kind"})
    best = runner.run([{}])[0]
    seen: set[str] = {json.dumps({}, sort_keys=True)}
    changed = True
    while changed and len(runner.trials) < trials:
        changed = False
        for name, values in space.items():
            now = best.params.get(name, defaults[name])
            configs = []
            for value in values:
                config = {**best.params, name: value}
                config = {k: v for k, v in config.items() if v != defaults[k]}
                key = json.dumps(config, sort_keys=True)
                if value != now and key not in seen:
                    seen.add(key)
                    configs.append(config)
            configs = configs[: trials - len(runner.trials)]
            if not configs:
                continue
            top = max(runner.run(configs), key=lambda t: (t.score(objective), -t.number))
            gain = _value(top, objective) - _value(best, objective)
            if gain > 0 and gain >= min_gain * _value(best, objective):
                best, changed = top, True
    return best


def run_tune(
    setup: TuneSetup,
    *,
    objective: Objective = "goodput",
    search: Search = "coordinate",
    trials: int = 32,
    min_gain: float = 0.005,
    search_seed: int = 0,
    jobs: int = 1,
    check: TuneSetup | None = None,
    advance: Callable[[int], None] | None = None,
) -> TuneResult:
    """Search ``setup.policy``'s thresholds with at most ``trials`` replays and keep the
    best; with ``check`` replay the defaults and the best on that setup too
    (``advance(n)`` after each replay)."""
    if trials < 1:
        raise UserError(f"--trials must be at least 1, got {trials}")
    if min_gain < 0:
        raise UserError(f"--min-gain must be 0 or more, got {min_gain}")
    space_of(setup.policy)  # a policy without thresholds is refused before any replay
    runner = _Runner(setup, jobs, advance)
    if search == "random":
        best = _random(runner, setup.policy, objective, trials, search_seed)
    else:
        best = _coordinate(runner, setup.policy, objective, trials, min_gain)
    checked: CheckResult | None = None
    if check is not None:
        offset = len(runner.trials)

        def later(n: int) -> None:
            if advance is not None:
                advance(offset + n)

        pair = _run_all([(check, 0, {}), (check, best.number, best.params)], jobs, later)
        checked = CheckResult(
            trace=check.trace,
            preset=check.preset,
            rate_scale=check.rate_scale,
            default=pair[0],
            tuned=pair[1],
        )
    return TuneResult(
        trace=setup.trace,
        preset=setup.preset,
        policy=setup.policy,
        objective=objective,
        search=search,
        rate_scale=setup.rate_scale,
        seed=setup.seed,
        trials=sorted(runner.trials, key=lambda t: t.number),
        best=best,
        check=checked,
    )

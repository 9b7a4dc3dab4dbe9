"""`replay tune`: search a policy's thresholds for the best SLA goodput or BCR.

Trial 0 is the policy's defaults. A trial replays its configuration on every tuning
scenario (one or more traces, at one or more rate scales: thresholds should hold across
loads) and is scored by the objective summed over them: SLA-compliant goodput, or BCR
(goodput per cost; the cluster is fixed, so both rank alike unless the preset changes);
ties go to the lower worst TTFT P99, then P50.

The default search is coordinate ascent from the defaults: one threshold at a time, its
other values from the search space (``replay.tuning.space``) are replayed, and the best
of those that lose on no scenario is kept if it raises the objective by ``min_gain``
(relative). A configuration thus moves away from the defaults only for gains that hold
on every scenario. (A random search over all thresholds at once, also offered, found
configurations that won 1.5% on the trace and load they were tuned on and lost on
another; so did coordinate ascent on a single load.) Optionally the defaults and the
best are then replayed on check scenarios, a trace the search never saw (at one or
more loads). The configurations of a round (one threshold's values; the random search's
draws) are independent: their replays run at once on the ``executor``'s workers, and the
search takes the same steps as one run serially.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel

from policies.registry import parse_policy
from replay.experiments.executor import Executor
from replay.tuning.space import draw_trials, space_of
from replay.tuning.trial import Objective, Trial, TuneSetup, run_trials
from router.errors import UserError

__all__ = ["CheckResult", "Search", "TuneResult", "run_tune"]

Search = Literal["coordinate", "random"]


class CheckResult(BaseModel):
    """The defaults and the tuned configuration replayed on other scenarios."""

    scenarios: list[str]
    default: Trial
    tuned: Trial

    @property
    def not_worse(self) -> bool:
        """The tuned configuration's SLA goodput, summed over the check, is not lower."""
        return self.tuned.goodput_rps >= self.default.goodput_rps


class TuneResult(BaseModel):
    policy: str
    objective: Objective
    search: Search
    scenarios: list[str]
    trials: list[Trial]
    best: Trial
    check: CheckResult | None = None


class _Runner:
    """Numbers and replays configurations in batches (a batch's replays at once on the
    executor); keeps every trial and counts the replays done."""

    def __init__(
        self,
        setups: Sequence[TuneSetup],
        executor: Executor | None,
        advance: Callable[[int], None] | None,
    ) -> None:
        self.setups = setups
        self.executor = executor
        self.advance = advance
        self.trials: list[Trial] = []
        self.replays = 0

    def run(
        self, configs: list[tuple[int, dict[str, Any]]], setups: Sequence[TuneSetup] = ()
    ) -> list[Trial]:
        """Trials numbered as given, on ``setups`` (default: the tuning scenarios)."""
        before = self.replays

        def moved(n: int) -> None:
            self.replays = before + n
            if self.advance is not None:
                self.advance(self.replays)

        return run_trials(setups or self.setups, configs, self.executor, moved)

    def search(self, configs: list[dict[str, Any]]) -> list[Trial]:
        """The next trials of the search (numbered on from the last)."""
        first = len(self.trials)
        done = self.run([(first + i, c) for i, c in enumerate(configs)])
        self.trials.extend(done)
        return done


def _best(trials: Sequence[Trial], objective: Objective) -> Trial:
    return max(trials, key=lambda t: (t.score(objective), -t.number))


def _coordinate(
    runner: _Runner, policy: str, objective: Objective, trials: int, min_gain: float
) -> Trial:
    """One threshold at a time from the defaults; see the module docstring."""
    space = space_of(policy)
    defaults = parse_policy(policy).model_dump(exclude={"kind"})
    best = runner.search([{}])[0]
    seen = {json.dumps({}, sort_keys=True)}
    changed = True
    while changed and len(runner.trials) < trials:
        changed = False
        for name, values in space.items():
            now = best.params.get(name, defaults[name])
            configs = []
            for value in values:
                config = {k: v for k, v in {**best.params, name: value}.items() if v != defaults[k]}
                key = json.dumps(config, sort_keys=True)
                if value != now and key not in seen:
                    seen.add(key)
                    configs.append(config)
            configs = configs[: trials - len(runner.trials)]
            if not configs:
                continue
            fair = [t for t in runner.search(configs) if t.not_worse_anywhere(best, objective)]
            if not fair:
                continue
            top = _best(fair, objective)
            gain = top.value(objective) - best.value(objective)
            if gain > 0 and gain >= min_gain * best.value(objective):
                best, changed = top, True
    return best


def run_tune(
    setups: Sequence[TuneSetup],
    *,
    objective: Objective = "goodput",
    search: Search = "coordinate",
    trials: int = 32,
    min_gain: float = 0.001,
    search_seed: int = 0,
    executor: Executor | None = None,
    check: Sequence[TuneSetup] = (),
    advance: Callable[[int], None] | None = None,
) -> TuneResult:
    """Search the policy's thresholds with at most ``trials`` configurations, each replayed
    on every scenario of ``setups``; with ``check`` replay the defaults and the best on
    those scenarios too. A round's replays (its configurations on every scenario) run at
    once on ``executor`` (default: one after the other, here); ``advance(n)`` as the n-th
    replay of the whole run ends."""
    if not setups:
        raise UserError("give at least one trace to tune on")
    if trials < 1:
        raise UserError(f"--trials must be at least 1, got {trials}")
    if min_gain < 0:
        raise UserError(f"--min-gain must be 0 or more, got {min_gain}")
    policy = setups[0].policy
    space_of(policy)  # a policy without thresholds is refused before any replay
    runner = _Runner(setups, executor, advance)
    if search == "random":
        best = _best(runner.search(draw_trials(policy, trials, search_seed)), objective)
    else:
        best = _coordinate(runner, policy, objective, trials, min_gain)
    checked: CheckResult | None = None
    if check:
        pair = runner.run([(0, {}), (best.number, best.params)], check)
        labels = [c.label for c in check]
        checked = CheckResult(scenarios=labels, default=pair[0], tuned=pair[1])
    return TuneResult(
        policy=policy,
        objective=objective,
        search=search,
        scenarios=[s.label for s in setups],
        trials=sorted(runner.trials, key=lambda t: t.number),
        best=best,
        check=checked,
    )

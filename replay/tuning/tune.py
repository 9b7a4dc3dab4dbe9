"""`replay tune`: search a policy's thresholds for the best SLA goodput or BCR.

Trial 0 is the policy's defaults. A trial replays its configuration on every tuning
scenario (one or more traces, at one or more rate scales: thresholds should hold across
loads) and is scored by the objective summed over them: SLA goodput at the trace's rate,
or BCR at the trace's rate (that SLA goodput per 1000 USD/h; the cluster is fixed, so both
rank alike unless the preset changes);
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

Ranked by the objective summed over the scenarios (ties: lower worst TTFT P99, then P50),
the first trial need not be the best the coordinate search reports: a trial that loses on
one scenario against the incumbent is not kept, nor one that gains less than ``min_gain``
(``--min-gain``; equal objectives ranked apart by latency gain nothing). Each trial's
``verdict`` says what the search made of it ("best", "replaced by trial N", or why it was
not kept); ``TuneResult.why_not_first`` puts it in one line when the ranking's first trial
is not the best.

``TuneResult.write_trials_csv`` writes the trial table for a spreadsheet: one row per
trial and scenario, units in the column names (``TRIAL_COLUMNS``).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from policies.registry import parse_policy
from replay.experiments.executor import Executor
from replay.tuning.space import draw_trials, space_of
from replay.tuning.trial import Objective, Trial, TuneSetup, run_trials
from router.errors import UserError

__all__ = ["TRIAL_COLUMNS", "CheckResult", "Search", "TuneResult", "run_tune"]

Search = Literal["coordinate", "random"]


TRIAL_COLUMNS = (
    "trial", "rank", "best", "verdict", "params", "scenario", "sla_goodput_req_s",
    "bcr_at_trace_rate_per_1000_usd_h", "sla_attainment", "ttft_p50_s", "ttft_p99_s", "wan_gb",
    "rld_token_share", "max_gap_p99_s",
)  # fmt: skip


class CheckResult(BaseModel):
    """The defaults and the tuned configuration replayed on other scenarios (when the
    best is the defaults, they are replayed once and ``tuned`` is ``default``)."""

    scenarios: list[str]
    default: Trial
    tuned: Trial

    @property
    def not_worse(self) -> bool:
        """The tuned configuration's SLA goodput at the trace's rate, summed over the check, is
        not lower."""
        return self.tuned.sla_goodput_req_s >= self.default.sla_goodput_req_s


class TuneResult(BaseModel):
    policy: str
    objective: Objective
    search: Search
    scenarios: list[str]
    trials: list[Trial]
    best: Trial
    check: CheckResult | None = None
    min_gain: float = 0.001  # relative gain a trial needs to replace the incumbent

    def ranked(self) -> list[Trial]:
        """Every trial, the highest objective first (ties: the lower worst TTFT P99, then
        P50, then the earlier trial)."""
        return sorted(self.trials, key=lambda t: (t.score(self.objective), -t.number))[::-1]

    def why_not_first(self) -> str | None:
        """One line saying why the ranking's first trial is not the best (None if it is)."""
        first = self.ranked()[0]
        if first.number == self.best.number:
            return None
        why = first.verdict or "the search did not keep it"
        return (
            f"trial {first.number} ranks first but is not the best: {why}; a trial replaces "
            "the incumbent only if it loses on no scenario and gains at least --min-gain "
            "(relative)"
        )

    def write_trials_csv(self, path: Path) -> None:
        """One row per trial and scenario (``TRIAL_COLUMNS``): ``rank`` as printed,
        ``sla_attainment`` a fraction (0-1), BCR in req/s per 1000 USD/h, WAN in GB."""
        rank = {t.number: i for i, t in enumerate(self.ranked(), start=1)}
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(TRIAL_COLUMNS)
            for trial in self.trials:
                params = "; ".join(f"{k}={v}" for k, v in sorted(trial.params.items()))
                for fig in trial.figures:
                    writer.writerow([
                        trial.number, rank[trial.number], trial.number == self.best.number,
                        trial.verdict or "", params, fig.scenario, fig.sla_goodput_req_s,
                        fig.bcr_at_trace_rate_per_1000_usd_h, fig.sla_attainment,
                        _blank(fig.ttft_p50_s), _blank(fig.ttft_p99_s),
                        round(fig.wan_bytes / 1e9, 6), fig.rld_token_share,
                        _blank(fig.max_gap_p99_s),
                    ])  # fmt: skip


def _blank(value: float | None) -> float | str:
    return "" if value is None else value


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
    """One threshold at a time from the defaults; see the module docstring. Sets each
    trial's ``verdict``."""
    space = space_of(policy)
    defaults = parse_policy(policy).model_dump(exclude={"kind"})
    best = runner.search([{}])[0]
    verdicts: dict[int, str] = {}
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
            fair = []
            for trial in runner.search(configs):
                lost = _lost_on(trial, best, objective)
                if lost is None:
                    fair.append(trial)
                else:
                    verdicts[trial.number] = f"it loses on {lost} against trial {best.number}"
            if not fair:
                continue
            top = _best(fair, objective)
            for trial in fair:
                if trial is not top:
                    verdicts[trial.number] = f"trial {top.number} did better in its round"
            gain = top.value(objective) - best.value(objective)
            if gain > 0 and gain >= min_gain * best.value(objective):
                verdicts[best.number] = f"replaced by trial {top.number}"
                best, changed = top, True
            else:
                verdicts[top.number] = _short_gain(top, best, objective, gain, min_gain)
    verdicts[best.number] = "best"
    runner.trials = [
        t.model_copy(update={"verdict": verdicts.get(t.number)}) for t in runner.trials
    ]
    return next(t for t in runner.trials if t.number == best.number)


def _lost_on(trial: Trial, incumbent: Trial, objective: Objective) -> str | None:
    """The first scenario where ``trial`` does worse than ``incumbent`` (None: nowhere)."""
    for a, b in zip(trial.figures, incumbent.figures, strict=True):
        if a.value(objective) < b.value(objective):
            return a.scenario
    return None


def _short_gain(top: Trial, best: Trial, objective: Objective, gain: float, least: float) -> str:
    """Why ``top`` did not replace ``best``: no gain, or less than ``least`` (relative)."""
    name = "BCR at the trace's rate" if objective == "bcr" else "SLA goodput at the trace's rate"
    if gain <= 0:
        return f"its {name} is no higher than trial {best.number}'s"
    base = best.value(objective)
    return (
        f"its {name} is {gain / base:.3%} above trial {best.number}'s, under "
        f"--min-gain {least:g} ({least * 100:.3g}%)"
    )


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
    if check:  # the defaults and the best; once if the best is the defaults
        configs: list[tuple[int, dict[str, Any]]] = [(0, {})]
        if best.number != 0:
            configs.append((best.number, best.params))
        pair = runner.run(configs, check)
        labels = [c.label for c in check]
        checked = CheckResult(scenarios=labels, default=pair[0], tuned=pair[-1])
    return TuneResult(
        policy=policy,
        objective=objective,
        search=search,
        scenarios=[s.label for s in setups],
        trials=sorted(runner.trials, key=lambda t: t.number),
        best=best,
        check=checked,
        min_gain=min_gain,
    )

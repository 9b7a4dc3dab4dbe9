"""Capacity at steady state: the highest arrival rate at which the target share of requests
meets the SLA, measured over a stationary window, with a 95% interval.

The search talks to the cluster through one callable, ``Measure``: ``measure(rate_req_s,
seed)`` replays (or models) traffic at that arrival rate and returns the SLA attainment of
each of a few equal windows of the steady state (``WindowedAttainment``). How the traffic
is made long enough and how the warm-up is left out is the measure's business
(``replay.experiments.steady_replay`` does it by tiling the trace).

For each seed the rate is bracketed (from ``start_req_s``, multiplied or divided by
``step`` until one rate passes and one fails) and bisected until the bracket is within
``tolerance`` (relative, 2% by default). A seed's capacity is its highest passing rate
below its lowest failing one. The point estimate is the mean over seeds; the interval is
a percentile bootstrap over seeds and windows: seeds drawn with replacement, then each
drawn seed's windows drawn with replacement (the same window positions at every probe of
that seed, so a burst counts against every rate), the seed's capacity found again from its
own probes. The interval is no finer than the probes: about ``tolerance`` near the answer.

Warnings a user should see: attainment that is not monotone in the rate, over all of a
seed's probes (a rate passes above one that fails: the answer is a crossing point, not
the only one), a trace too short to hold the window at the capacity rate (it was tiled;
see ``tiling``), and an interval bound outside the probed rates (extrapolated).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "CapacityProbe",
    "CapacityResult",
    "CapacitySettings",
    "Measure",
    "WindowedAttainment",
    "find_capacity",
    "seed_capacity",
]

MAX_BRACKET_STEPS = 10
BOOTSTRAP_REPLICATES = 2000
MONOTONE_SLACK = 0.05


class WindowedAttainment(BaseModel):
    """SLA attainment at one arrival rate: requests meeting the SLA per steady-state window."""

    model_config = ConfigDict(frozen=True)

    met: tuple[int, ...]  # requests meeting the SLA, per window
    total: tuple[int, ...]  # requests arriving, per window
    copies: int = 1  # copies of the trace tiled to hold warm-up and window
    trace_span_s: float | None = None  # one copy's span at this rate, seconds
    needed_s: float | None = None  # warm-up plus window, seconds

    @property
    def attainment(self) -> float:
        n = sum(self.total)
        return sum(self.met) / n if n else 0.0


Measure = Callable[[float, int], WindowedAttainment]
"""``measure(rate_req_s, seed)``: the steady-state attainment at that arrival rate."""


class CapacitySettings(BaseModel):
    """How capacity is searched."""

    model_config = ConfigDict(frozen=True)

    target: float = Field(0.9, gt=0, le=1)
    tolerance: float = Field(0.02, gt=0)
    max_probes: int = Field(14, ge=2)  # per seed
    seeds: tuple[int, ...] = (0, 1)
    start_req_s: float = Field(1.0, gt=0)
    step: float = Field(2.0, gt=1)
    floor_req_s: float = Field(0.0, ge=0)  # a rate at or below this failing ends the search


class CapacityProbe(BaseModel):
    """One measured rate."""

    model_config = ConfigDict(frozen=True)

    seed: int
    rate_req_s: float
    attainment: float
    passed: bool
    windows: WindowedAttainment


class CapacityResult(BaseModel):
    """Capacity and SLA goodput at capacity, with 95% intervals over seeds and windows."""

    capacity_req_s: float
    capacity_low_req_s: float
    capacity_high_req_s: float
    sla_goodput_req_s: float  # SLA goodput at capacity: capacity x its attainment
    sla_goodput_low_req_s: float
    sla_goodput_high_req_s: float
    per_seed_req_s: list[float]
    bracketed: bool  # every seed found a failing rate
    monotone: bool
    interval_extrapolated: bool = False  # a bound lies outside the probed rates
    probes: list[CapacityProbe]
    warnings: list[str]


def _crossing(rates: Sequence[float], att: Sequence[float], target: float) -> tuple[float, float]:
    """(capacity, attainment there): the highest passing rate below the lowest failing one."""
    failing = [r for r, a in zip(rates, att, strict=True) if a < target]
    ceiling = min(failing, default=float("inf"))
    passing = [(r, a) for r, a in zip(rates, att, strict=True) if a >= target and r < ceiling]
    return max(passing, default=(0.0, 0.0))


def seed_capacity(result: CapacityResult, seed: int, target: float) -> tuple[float, float]:
    """(capacity, SLA goodput there) of one seed of ``result``, from its own probes, as
    ``find_capacity`` found it for that seed ((0, 0) for a seed it did not search)."""
    probes = [p for p in result.probes if p.seed == seed]
    cap, att = _crossing(
        [p.rate_req_s for p in probes], [p.attainment for p in probes], target
    )  # fmt: skip
    return cap, cap * att


def _resampled_crossing(
    rates: Sequence[float], att: Sequence[float], target: float
) -> tuple[float, float]:
    """``_crossing``, except when a resampled seed fails at its lowest probe: then the
    crossing is below what was probed, extrapolated along the attainment's slope between
    the two lowest probes (or in proportion to the attainment when it does not fall)."""
    cap, got = _crossing(rates, att, target)
    if cap > 0 or not rates:
        return cap, got
    order = sorted(range(len(rates)), key=lambda i: rates[i])
    r0, a0 = rates[order[0]], att[order[0]]
    slope = 0.0
    if len(order) > 1:
        r1, a1 = rates[order[1]], att[order[1]]
        slope = (a1 - a0) / (r1 - r0) if r1 > r0 else 0.0
    below = r0 + (target - a0) / slope if slope < 0 else r0 * a0 / target
    return max(below, 0.0), target


def _search_seed(
    measure: Measure, seed: int, start: float, step: float, s: CapacitySettings
) -> list[CapacityProbe]:
    probes: list[CapacityProbe] = []
    low: float | None = None
    high: float | None = None
    rate, steps = start, 0
    while len(probes) < s.max_probes:
        got = measure(rate, seed)
        passed = got.attainment >= s.target
        probes.append(CapacityProbe(
            seed=seed, rate_req_s=rate, attainment=got.attainment, passed=passed, windows=got
        ))  # fmt: skip
        if passed:
            low = rate if low is None else max(low, rate)
        else:
            high = rate if high is None else min(high, rate)
        if low is not None and high is not None:
            if (high - low) / low <= s.tolerance:
                break
            rate = (low + high) / 2.0
        elif steps >= MAX_BRACKET_STEPS or (not passed and rate <= s.floor_req_s):
            break
        else:
            steps += 1
            rate = rate * step if high is None else rate / step
    return probes


def _bootstrap(
    by_seed: list[list[CapacityProbe]], target: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    caps = np.empty(BOOTSTRAP_REPLICATES)
    goods = np.empty(BOOTSTRAP_REPLICATES)
    for b in range(BOOTSTRAP_REPLICATES):
        cap_sum = good_sum = 0.0
        for i in rng.integers(0, len(by_seed), len(by_seed)):
            probes = by_seed[i]
            k = len(probes[0].windows.met)
            pick = rng.integers(0, k, k)
            att = []
            for p in probes:
                met = np.asarray(p.windows.met)[pick].sum()
                total = np.asarray(p.windows.total)[pick].sum()
                att.append(float(met / total) if total else 0.0)
            rates = [p.rate_req_s for p in probes]
            found = _crossing(rates, [p.attainment for p in probes], target)[0] > 0
            crossing = _resampled_crossing if found else _crossing
            cap, a = crossing(rates, att, target)
            cap_sum, good_sum = cap_sum + cap, good_sum + cap * a
        caps[b], goods[b] = cap_sum / len(by_seed), good_sum / len(by_seed)
    return caps, goods


def _non_monotone(probes: Sequence[CapacityProbe], target: float) -> str | None:
    """A higher rate that passes where a lower one fails, or whose attainment is higher by
    more than ``MONOTONE_SLACK`` (noise between windows of a few hundred requests)."""
    ordered = sorted(probes, key=lambda p: p.rate_req_s)
    for i, lo in enumerate(ordered):
        for hi in ordered[i + 1 :]:
            inverted = hi.passed and not lo.passed
            if inverted or hi.attainment > lo.attainment + MONOTONE_SLACK:
                return (
                    f"seed {lo.seed}: attainment is not monotone in the rate: "
                    f"{lo.attainment:.1%} at {lo.rate_req_s:.3f} req/s but "
                    f"{hi.attainment:.1%} at {hi.rate_req_s:.3f} req/s (target {target:.0%}); "
                    "the capacity is a crossing point, not the only one"
                )
    return None


SHORT_TRACE = "the trace is too short for a steady state"
"""How the warning of a search on a trace tiled to reach its window begins."""


def _short_trace(probes: Sequence[CapacityProbe], capacity: float) -> str | None:
    near = [p for p in probes if p.passed and p.rate_req_s <= capacity]
    if not near:
        return None
    w = max(near, key=lambda p: p.rate_req_s).windows
    if w.copies <= 1 or w.trace_span_s is None or w.needed_s is None:
        return None
    return (
        f"{SHORT_TRACE} at {capacity:.3f} req/s: it spans "
        f"{w.trace_span_s:.0f} s there, less than the {w.needed_s:.0f} s of warm-up and "
        f"window, so it was tiled {w.copies} times with fresh sessions (capacity assumes "
        "the trace's mix repeats)"
    )


def _extrapolated(probes: Sequence[CapacityProbe], low: float, high: float) -> str | None:
    """A warning when the interval reaches past the probed rates (a resampled seed that
    fails at its lowest probe has its crossing extrapolated below it)."""
    rates = [round(p.rate_req_s, 6) for p in probes]  # as the bounds are rounded
    if not rates:
        return None
    below = 0.0 < low < min(rates)  # 0 is no passing rate, not an extrapolation
    if not below and high <= max(rates):
        return None
    return (
        f"the 95% interval [{low:.3f}, {high:.3f}] req/s reaches past the probed rates "
        f"[{min(rates):.3f}, {max(rates):.3f}] req/s: that bound is extrapolated"
    )


def find_capacity(
    measure: Measure, settings: CapacitySettings, *, seed_rng: int = 0
) -> CapacityResult:
    """Search each seed's capacity with ``measure`` and bootstrap the interval."""
    by_seed: list[list[CapacityProbe]] = []
    start, step = settings.start_req_s, settings.step
    for seed in settings.seeds:
        probes = _search_seed(measure, seed, start, step, settings)
        by_seed.append(probes)
        cap, _ = _crossing(
            [p.rate_req_s for p in probes], [p.attainment for p in probes], settings.target
        )
        if cap > 0:  # the next seed starts at this one's answer, a small step away
            start, step = cap, 1.0 + 4 * settings.tolerance
    per_seed = []
    per_goodput = []
    for probes in by_seed:
        cap, att = _crossing(
            [p.rate_req_s for p in probes], [p.attainment for p in probes], settings.target
        )
        per_seed.append(cap)
        per_goodput.append(cap * att)
    caps, goods = _bootstrap(by_seed, settings.target, np.random.default_rng(seed_rng))
    all_probes = [p for probes in by_seed for p in probes]
    capacity = float(np.mean(per_seed))
    warnings = [w for w in (_non_monotone(p, settings.target) for p in by_seed) if w is not None]
    monotone = not warnings
    short = _short_trace(all_probes, capacity)
    if short is not None:
        warnings.append(short)
    bracketed = all(any(not p.passed for p in probes) for probes in by_seed)
    if not bracketed:
        warnings.append("no rate failed the SLA: the capacity is a lower bound")
    low, high = (round(float(np.percentile(caps, q)), 6) for q in (2.5, 97.5))
    extrapolated = _extrapolated(all_probes, low, high)
    if extrapolated is not None:
        warnings.append(extrapolated)
    return CapacityResult(
        capacity_req_s=round(capacity, 6),
        capacity_low_req_s=low,
        capacity_high_req_s=high,
        sla_goodput_req_s=round(float(np.mean(per_goodput)), 6),
        sla_goodput_low_req_s=round(float(np.percentile(goods, 2.5)), 6),
        sla_goodput_high_req_s=round(float(np.percentile(goods, 97.5)), 6),
        per_seed_req_s=[round(c, 6) for c in per_seed],
        bracketed=bracketed,
        monotone=monotone,
        interval_extrapolated=extrapolated is not None,
        probes=all_probes,
        warnings=warnings,
    )

"""The configuration of ``replay compare``, ``replay sweep`` and ``replay overload``: each
command's own small model, embedding the ``ReplaySettings`` every one of its replays
shares (so an arm, a probe or a point can set every option ``replay run`` has).

The fields' descriptions are the CLI's help (``cli.config_options``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from replay.experiments.steady_replay import SteadyWindow
from replay.runner.config import ReplaySettings

__all__ = ["CompareConfig", "OverloadConfig", "SteadyOptions", "SweepConfig", "SweepSearch"]

_STRICT = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
_TRACE = "Trace file (format detected: mooncake, bailian, ...)"
_ARM = "NAME [:KEY=VALUE,...] [@PRESET], e.g. pdd:wan_budget_s=0.5 or idc-pd@idc-pd (@PRESET: a "
_PRESET = (
    "Cluster preset (a name from `replay presets`, or a preset file) of every policy not "
    "written NAME@PRESET"
)


def _trace() -> Any:
    return Field(description=_TRACE, json_schema_extra={"argument": True})


def _preset() -> Any:
    return Field(None, description=_PRESET)


class CompareConfig(BaseModel):
    """A trace replayed under several policies (or deployments) and compared."""

    model_config = _STRICT

    trace: str = _trace()
    preset: str | None = _preset()
    policies: list[str] = Field(
        description=_ARM + "policy on its own cluster: compare deployments); repeat, the first "
        "is the baseline",
        json_schema_extra={"flags": ["--policy"]},
    )
    replay: ReplaySettings = ReplaySettings()
    resamples: int = Field(1000, ge=100, description="Bootstrap resamples")
    window_s: float | None = Field(
        None,
        gt=0,
        description="Rate window, seconds (default 60, shortened to give 30 windows)",
        json_schema_extra={"flags": ["--window"]},
    )


class SweepSearch(BaseModel):
    """How ``replay sweep`` bisects the rate scale."""

    model_config = _STRICT

    target: float = Field(0.9, gt=0, le=1, description="SLA attainment to sustain (0-1]")
    tolerance: float = Field(
        0.02, gt=0, description="Stop when the bracket is this close (relative)"
    )
    max_probes: int = Field(16, ge=2, description="Most replays to run")
    start_scale: float = Field(1.0, gt=0, description="First --rate-scale to try")


class SteadyOptions(BaseModel):
    """How capacity at steady state is measured after the sweep's search."""

    model_config = _STRICT

    window_s: float = Field(
        300.0, ge=0, description="Steady-state seconds judged per rate for the capacity, "
        "after --warmup (0: no capacity at steady state)",
        json_schema_extra={"flags": ["--window"]},
    )  # fmt: skip
    warmup_s: float = Field(
        60.0, ge=0, description="Seconds left out at each rate",
        json_schema_extra={"flags": ["--warmup"]},
    )  # fmt: skip
    seeds: int = Field(2, ge=1, description="Seeds of the capacity (--seed, +1, ...)")

    def window(self) -> SteadyWindow:
        return SteadyWindow(warmup_s=self.warmup_s, window_s=self.window_s)


class SweepConfig(BaseModel):
    """Each policy's capacity on a trace, by bisection of the rate scale."""

    model_config = _STRICT

    trace: str = _trace()
    preset: str | None = _preset()
    policies: list[str] = Field(
        min_length=1,
        description=_ARM + "policy on its own cluster); repeat to sweep several, each on its own",
        json_schema_extra={"flags": ["--policy"]},
    )
    replay: ReplaySettings = ReplaySettings()
    search: SweepSearch = SweepSearch()
    steady: SteadyOptions = SteadyOptions()


class OverloadConfig(BaseModel):
    """A policy's capacity (a sweep), then replays at multiples of it."""

    model_config = _STRICT

    trace: str = _trace()
    preset: str | None = _preset()
    policy: str = Field(
        "pdd-adaptive",
        description=_ARM + "policy on its own cluster)",
        json_schema_extra={"flags": ["--policy"]},
    )
    replay: ReplaySettings = ReplaySettings()
    multiples: list[float] = Field(
        [0.5, 1.0, 1.2, 1.5, 2.0],
        min_length=1,
        description="Arrival rates to replay, as multiples of the capacity rate",
    )
    target: float = Field(
        0.9, gt=0, le=1, description="SLA attainment that defines the capacity (as in sweep)"
    )

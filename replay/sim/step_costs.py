"""What one engine step costs: the one interface the simulator's instances price with,
and the choice of its source for each pool.

Three sources stand behind it (``StepCostsSpec.source``):

- ``perfdb``: measured kernels from AIConfigurator's performance database
  (``PerfDbCosts``), for the GPU, the model's real shape, the pool's parallelism and
  engine;
- ``calibrated``: the linear pass times ``pdd-router calibrate`` fitted on the user's
  own engine (``Roofline`` with ``fitted``);
- ``roofline``: datasheet FLOPs and bandwidth times efficiencies (``Roofline``).

``auto`` (the default) takes the first that applies: calibrated when the pool has fitted
times, else the database where it covers the GPU, model and engine, else the roofline,
with the reason the database could not be used.

``ScaledStepCosts`` multiplies every pass a source prices (prefill, decode, mixed and
extend steps) by one factor, whatever the source: a replay's ``step_cost_scale``, to ask
how an answer moves when the step costs are off by that much. The server's time outside
the passes (``frontend_s``, ``dispatch_s``) is not a step and is left as it is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

from replay.presets.cluster_preset import ClusterPreset
from replay.presets.schema import PoolSpec, StepCostsSpec
from replay.sim.perfdb_costs import PerfDbCosts, PerfDbUnavailable, perfdb_key
from replay.sim.roofline import Roofline
from router.errors import UserError

__all__ = ["ResolvedStepCosts", "ScaledStepCosts", "StepCosts", "resolve_step_costs"]


class StepCosts(Protocol):
    """Seconds one instance spends on each kind of pass."""

    gpus: int

    @property
    def frontend_s(self) -> float: ...

    @property
    def dispatch_s(self) -> float: ...

    def prefill_s(self, items: list[tuple[int, int]]) -> float: ...

    def decode_step_s(self, batch: int, context_tokens: float) -> float: ...

    def mixed_step_s(
        self, batch: int, context_tokens: float, chunk: float, chunk_context: float
    ) -> float: ...

    def extend_s(self, tokens: int, context_tokens: int) -> float: ...


class ScaledStepCosts:
    """``costs`` with every pass ``scale`` times as long (1.15: 15% slower steps)."""

    __slots__ = ("_costs", "gpus", "scale")

    def __init__(self, costs: StepCosts, scale: float) -> None:
        if not scale > 0:
            raise ValueError(f"step cost scale must be positive, got {scale}")
        self._costs = costs
        self.gpus = costs.gpus
        self.scale = scale

    @property
    def frontend_s(self) -> float:
        return self._costs.frontend_s

    @property
    def dispatch_s(self) -> float:
        return self._costs.dispatch_s

    def prefill_s(self, items: list[tuple[int, int]]) -> float:
        return self.scale * self._costs.prefill_s(items)

    def decode_step_s(self, batch: int, context_tokens: float) -> float:
        return self.scale * self._costs.decode_step_s(batch, context_tokens)

    def mixed_step_s(
        self, batch: int, context_tokens: float, chunk: float, chunk_context: float
    ) -> float:
        return self.scale * self._costs.mixed_step_s(batch, context_tokens, chunk, chunk_context)

    def extend_s(self, tokens: int, context_tokens: int) -> float:
        return self.scale * self._costs.extend_s(tokens, context_tokens)


@dataclass(frozen=True, slots=True)
class ResolvedStepCosts:
    """A pool's step costs and where they come from, in words."""

    costs: StepCosts
    source: str  # perfdb, calibrated or roofline
    detail: str  # what was used, or why the database was not

    def describe(self) -> str:
        return f"{self.source} ({self.detail})"

    def scaled(self, scale: float) -> ResolvedStepCosts:
        """The same source with every pass ``scale`` times as long (itself at 1)."""
        if scale == 1.0:
            return self
        detail = f"{self.detail}; every step x{scale:g}"
        return ResolvedStepCosts(ScaledStepCosts(self.costs, scale), self.source, detail)


def resolve_step_costs(preset: ClusterPreset, pool_name: str) -> ResolvedStepCosts:
    """The step costs of ``pool_name``'s instances, by its ``step_costs.source``; the
    database's own settings, set away from their defaults on a pool priced otherwise, are
    named as unused."""
    resolved = _resolve(preset, pool_name)
    if resolved.source == "perfdb":
        return resolved
    spec, default = preset.spec.pools[pool_name].step_costs, StepCostsSpec()
    unused = [
        name
        for name in ("dispatch_s_per_layer", "engine", "engine_version", "step_overhead_s")
        if getattr(spec, name) != getattr(default, name)
    ]
    if not unused:
        return resolved
    said = ", ".join(f"step_costs.{name}" for name in unused)
    return dataclasses.replace(resolved, detail=f"{resolved.detail}; {said} unused here")


def _resolve(preset: ClusterPreset, pool_name: str) -> ResolvedStepCosts:
    pool = preset.spec.pools[pool_name]
    wanted = pool.step_costs.source
    if wanted == "calibrated" or (wanted == "auto" and pool.fitted is not None):
        assert pool.fitted is not None  # the schema refuses calibrated without fitted
        detail = pool.fitted.source or "pdd-router calibrate"
        return ResolvedStepCosts(_roofline(preset, pool, calibrated=True), "calibrated", detail)
    if wanted == "roofline":
        return ResolvedStepCosts(_roofline(preset, pool), "roofline", "asked for")
    try:
        return _perfdb(preset, pool)
    except PerfDbUnavailable as exc:
        if wanted == "perfdb":
            raise UserError(
                f"pool {pool_name!r}: step_costs.source is perfdb but the performance "
                f"database cannot price it: {exc} (set step_costs.source to roofline, or "
                "auto to fall back)"
            ) from exc
        return ResolvedStepCosts(_roofline(preset, pool), "roofline", f"no measured data: {exc}")


def _perfdb(preset: ClusterPreset, pool: PoolSpec) -> ResolvedStepCosts:
    hardware = preset.hardware[pool.hardware]
    key = perfdb_key(preset.model, hardware.perfdb_system, pool)
    costs = PerfDbCosts(key, preset.model, pool.step_costs, preset.spec.handoff)
    version = f" {key.engine_version}" if key.engine_version else ""
    detail = (
        f"AIConfigurator database: {key.model} on {key.system}, {key.engine}{version}, "
        f"TP{key.tp}" + (f" EP{key.moe_ep}" if key.moe_ep > 1 else "")
    )
    return ResolvedStepCosts(costs, "perfdb", detail)


def _roofline(preset: ClusterPreset, pool: PoolSpec, *, calibrated: bool = False) -> Roofline:
    spec = preset.spec
    return Roofline(
        preset.model, preset.hardware[pool.hardware], pool.gpus_per_instance, spec.timing,
        spec.handoff, pool.fitted if calibrated else None,
    )  # fmt: skip

"""A ``Measure`` backed by the simulator: the trace tiled to a steady window at each rate.

At arrival rate ``R`` the trace (rate ``r``) is replayed ``R / r`` times faster, rotated
by the seed's phase (``seed_phase``: seed 0 as is, every other seed starting at another
point of the trace, so two seeds judge different traffic), tiled
(``replay.trace.tiling``) until it holds the warm-up, the window and a tail, and cut
after the tail. Requests arriving in the warm-up (caches filling, queues forming) and in
the tail (their load still weighs on the window's requests, but they are not judged)
are left out; the window is split into equal sub-windows whose attainment the capacity
search bootstraps. A request meets the SLA as ``summarize`` counts it: finished, TTFT
and TPOT within the thresholds (a refused request does not).

The replay itself is a callable ``Replay(requests, rate_scale, seed) -> records``, so how
a deployment is replayed is decided by whoever builds the measure (``deployment_replay``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from replay.experiments.capacity import WindowedAttainment
from replay.experiments.policy_spec import parse_policy_spec
from replay.metrics.columns import float_values
from replay.metrics.record import RequestRecord
from replay.metrics.summary import SlaThresholds
from replay.runner.config import ReplaySettings
from replay.trace.record import TraceRequest
from replay.trace.tiling import copies_for, rotate, seed_phase, tile, tile_period_s

__all__ = ["Replay", "SteadyMeasure", "SteadyWindow", "deployment_replay"]

Replay = Callable[[Sequence[TraceRequest], float, int], Sequence[RequestRecord]]


class SteadyWindow(BaseModel):
    """Simulated seconds: left out first, judged (in ``windows`` parts), replayed after."""

    model_config = ConfigDict(frozen=True)

    warmup_s: float = Field(60.0, ge=0)
    window_s: float = Field(300.0, gt=0)
    windows: int = Field(5, ge=2)
    tail_s: float = Field(30.0, ge=0)

    @property
    def needed_s(self) -> float:
        return self.warmup_s + self.window_s


def deployment_replay(preset: str, policy: str, settings: ReplaySettings) -> Replay:
    """Replays on ``preset`` under ``policy`` (``NAME:k=v`` allowed), each with
    ``settings`` at the rate scale and seed asked."""
    from replay.runner.run import run_replay  # the simulator, only when a replay runs

    spec = parse_policy_spec(policy)

    def replay(
        requests: Sequence[TraceRequest], rate_scale: float, seed: int
    ) -> Sequence[RequestRecord]:
        config = settings.replay(
            "<tiled trace>", preset, spec.name, spec.params, rate_scale=rate_scale, seed=seed,
            max_requests=None,
        )  # fmt: skip
        return run_replay(config, requests=requests).records

    return replay


@dataclass(frozen=True, slots=True)
class SteadyMeasure:
    """``measure(rate_req_s, seed)`` over ``requests`` replayed by ``replay``."""

    requests: Sequence[TraceRequest]
    replay: Replay
    sla: SlaThresholds
    window: SteadyWindow

    @property
    def trace_rate_req_s(self) -> float:
        """The trace's rate as tiled: its requests per tiling period."""
        return len(self.requests) / tile_period_s(self.requests)

    def __call__(self, rate_req_s: float, seed: int) -> WindowedAttainment:
        w = self.window
        scale = rate_req_s / self.trace_rate_req_s
        horizon = (w.needed_s + w.tail_s) * scale  # trace seconds to replay
        copies = copies_for(self.requests, w.needed_s * scale)
        rotated = rotate(self.requests, seed_phase(seed))  # each seed its own stretch
        period = tile_period_s(self.requests)
        tiled = tile(rotated, copies_for(self.requests, horizon), period_s=period)
        first = tiled[0].arrival_s
        kept = [r for r in tiled if r.arrival_s - first <= horizon]
        records = self.replay(kept, scale, seed)
        return _windows(records, first / scale, self.sla, w, copies=copies, span_s=(
            (max(r.arrival_s for r in self.requests) - first) / scale
        ))  # fmt: skip


def _windows(
    records: Sequence[RequestRecord], t0: float, sla: SlaThresholds, w: SteadyWindow,
    *, copies: int, span_s: float,
) -> WindowedAttainment:  # fmt: skip
    arrival = float_values(records, "arrival_s") - t0
    ttft = float_values(records, "ttft_s")
    tpot = float_values(records, "tpot_s")
    done = np.isfinite(float_values(records, "e2e_s"))
    meets = done & (np.nan_to_num(ttft, nan=np.inf) <= sla.ttft_s)
    meets &= ~np.isfinite(tpot) | (tpot <= sla.tpot_s)
    edges = w.warmup_s + np.arange(w.windows + 1) * (w.window_s / w.windows)
    slot = np.searchsorted(edges, arrival, side="right") - 1
    inside = (slot >= 0) & (slot < w.windows)
    total = np.bincount(slot[inside], minlength=w.windows)
    met = np.bincount(slot[inside & meets], minlength=w.windows)
    return WindowedAttainment(
        met=tuple(int(m) for m in met), total=tuple(int(t) for t in total), copies=copies,
        trace_span_s=round(span_s, 6), needed_s=w.needed_s,
    )  # fmt: skip

"""``step_cost_scale``: every engine pass of a replay scaled by one factor, whatever the
pools' step-cost source, and nothing else."""

from __future__ import annotations

import pytest
from replay_support import replay

from replay.presets.loader import load_preset
from replay.sim.step_costs import ScaledStepCosts, resolve_step_costs
from replay.trace.record import TraceRequest

BLOCK = 512
ONE_ENGINE = {"pools.engines.instances": 1, "pools.engines.step_costs.source": "roofline"}


@pytest.mark.parametrize(("preset", "pool"), [("pdd-small", "md"), ("pdd-small", "rld")])
def test_every_pass_of_every_source_is_scaled_and_the_server_time_is_not(
    preset: str, pool: str
) -> None:
    """md is priced by the performance database, rld by the roofline (pdd-small)."""
    resolved = resolve_step_costs(load_preset(preset), pool)
    scaled = resolved.scaled(1.15)
    assert isinstance(scaled.costs, ScaledStepCosts)
    assert scaled.source == resolved.source
    assert "every step x1.15" in scaled.detail
    c, s = resolved.costs, scaled.costs
    assert s.prefill_s([(4096, 1024), (512, 0)]) == pytest.approx(
        1.15 * c.prefill_s([(4096, 1024), (512, 0)]), rel=1e-12
    )
    assert s.decode_step_s(16, 16 * 4096.0) == pytest.approx(
        1.15 * c.decode_step_s(16, 16 * 4096.0), rel=1e-12
    )
    assert s.mixed_step_s(4, 8192.0, 512, 1024) == pytest.approx(
        1.15 * c.mixed_step_s(4, 8192.0, 512, 1024), rel=1e-12
    )
    assert s.extend_s(20, 8000) == pytest.approx(1.15 * c.extend_s(20, 8000), rel=1e-12)
    assert (s.frontend_s, s.dispatch_s, s.gpus) == (c.frontend_s, c.dispatch_s, c.gpus)
    assert resolved.scaled(1.0) is resolved


def test_a_replay_at_step_cost_scale_115_takes_115_times_as_long_per_step() -> None:
    """One request alone on one colocated engine: its TTFT is the router's time plus four
    prefill chunks (32,768 tokens in steps of 8,192), its TPOT the mean of its decode
    steps; at x1.15 both passes cost 1.15 times as much and the router's time is the same
    (records keep microseconds: equal to within their rounding)."""
    trace = [TraceRequest(0, 0.0, 64 * BLOCK, 40, tuple(range(64)), BLOCK)]
    preset = load_preset("colocated-small", ONE_ENGINE)
    costs = resolve_step_costs(preset, "engines").costs
    router_s = preset.spec.timing.router_s
    chunks = sum(costs.prefill_s([(8192, 8192 * k)]) for k in range(4))
    base = replay(trace, "colocated-small", overrides=ONE_ENGINE).records[0]
    slow = replay(trace, "colocated-small", overrides=ONE_ENGINE, step_cost_scale=1.15).records[0]
    assert base.ttft_s is not None
    assert slow.ttft_s is not None
    assert base.tpot_s is not None
    assert slow.tpot_s is not None
    assert base.e2e_s is not None
    assert slow.e2e_s is not None
    assert base.ttft_s - router_s == pytest.approx(chunks, rel=0.02)
    assert slow.ttft_s - router_s == pytest.approx(1.15 * (base.ttft_s - router_s), abs=2e-6)
    assert slow.tpot_s == pytest.approx(1.15 * base.tpot_s, abs=2e-6)
    assert slow.e2e_s - router_s == pytest.approx(1.15 * (base.e2e_s - router_s), abs=2e-6)

"""`replay plan`'s bounds, line price and pruning, on hand-made loads with hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from replay.experiments import plan as plan_module
from replay.experiments.capacity import CapacityResult
from replay.experiments.capacity_job import CapacityJob
from replay.experiments.executor import SerialExecutor
from replay.experiments.plan import PlanSettings, run_plan
from replay.experiments.plan_bounds import TraceLoad, bounds_of
from replay.experiments.plan_space import PlanSpace, line_price_of, parse_counts
from replay.metrics.summary import SlaThresholds
from replay.presets.loader import load_preset
from replay.presets.schema import LinkSpec
from replay.runner.config import ReplaySettings
from router.errors import UserError

SLA = SlaThresholds(ttft_s=1.0, tpot_s=0.01)
KV = 70272.0  # kimi-k2-like bytes per token
ACTIVE, ATTN = 32.6e9, 2.49856e6  # kimi-k2-like active parameters, attention FLOPs per pair
H100_PREFILL = 8 * 989.0e12 * 0.4  # FLOP/s of an 8-GPU H100 instance at 40% MFU
# the bounds' closed forms below are the roofline's
ROOFLINE = {f"pools.{pool}.step_costs.source": "roofline" for pool in ("p", "rld", "md")}


def cold_load(n: int = 10, prompt: int = 10_000, output: int = 101) -> TraceLoad:
    """``n`` cold prompts (no prefix reuse) arriving over 100 s."""
    return TraceLoad(
        duration_s=100.0,
        input_tokens=np.full(n, float(prompt)),
        output_tokens=np.full(n, float(output)),
        hit_tokens=np.zeros(n),
    )


def test_prefill_bound_is_the_rate_at_which_p_finishes_the_served_prompts_in_time() -> None:
    preset = load_preset("pdd-small", ROOFLINE)  # 3 prefill instances of 8 H100
    one = (2 * ACTIVE * 10_000 + ATTN * 10_000**2 / 2) / H100_PREFILL  # 0.2455 s a prompt
    bounds = bounds_of(preset, cold_load(40), target=1.0, sla=SLA)
    # all 40 prompts on 3 instances must end within the trace's span plus the 1 s TTFT
    assert bounds.prefill_rps == pytest.approx(40 / (40 * one / 3 - 1.0), rel=1e-9)
    assert bounds.prefill_rps == pytest.approx(17.60, rel=1e-3)
    # the target share: 90% of 40 requests is the first 36
    ninety = bounds_of(preset, cold_load(40), target=0.9, sla=SLA)
    assert ninety.prefill_rps == pytest.approx(40 / (36 * one / 3 - 1.0), rel=1e-9)
    # prompts that 3 instances finish within the TTFT slack bound nothing
    assert bounds_of(preset, cold_load(10), target=1.0, sla=SLA).prefill_rps == float("inf")
    # every pass 15% longer (plan --step-cost-scale 1.15): the prompts' work is 1.15 times
    dearer = bounds_of(preset, cold_load(40), target=1.0, sla=SLA, step_cost_scale=1.15)
    assert dearer.prefill_rps == pytest.approx(40 / (1.15 * 40 * one / 3 - 1.0), rel=1e-9)


def test_line_bound_counts_uncached_kv_and_what_rld_can_absorb() -> None:
    no_rld = load_preset("pdd-small", ROOFLINE | {"pools.rld.instances": 0})
    bounds = bounds_of(no_rld, cold_load(), target=1.0, sla=SLA)
    carry_s = 10 * 10_000 * KV / (20e9 / 8)  # 2.81 s on 20 Gbps
    assert bounds.line_rps == pytest.approx(10 / (carry_s - 1.0), rel=1e-6)
    assert bounds.line_rps == pytest.approx(5.522, rel=1e-3)
    # half the prompt cached on MD's side: half the bytes
    half = cold_load()
    half = TraceLoad(half.duration_s, half.input_tokens, half.output_tokens, half.input_tokens / 2)
    assert bounds_of(no_rld, half, target=1.0, sla=SLA).line_rps == pytest.approx(
        10 / (carry_s / 2 - 1.0), rel=1e-6
    )
    # RLD finishes some requests itself, so with it the line takes more
    with_rld = bounds_of(load_preset("pdd-small", ROOFLINE), cold_load(), target=1.0, sla=SLA)
    assert with_rld.line_rps > bounds.line_rps
    # one-token outputs: RLD absorbs all of them at once and the line bounds nothing
    tiny = bounds_of(load_preset("pdd-small", ROOFLINE), cold_load(output=1), target=1.0, sla=SLA)
    assert tiny.line_rps == float("inf")


def test_memory_bound_and_the_tightest_limit() -> None:
    # 8 A100 40GB hold 320 GB: not the model's 520 GB of weights
    small = load_preset("pdd-small", ROOFLINE | {"pools.p.hardware": "a100-40gb"})
    bounds = bounds_of(small, cold_load(), target=1.0, sla=SLA)
    assert (bounds.memory_ok, bounds.limit, bounds.rps) == (False, "memory", 0.0)
    ok = bounds_of(load_preset("pdd-small", ROOFLINE), cold_load(40), target=1.0, sla=SLA)
    assert ok.limit == "line"  # 40 cold prompts: 11.2 s on the line, 3.3 s on P
    assert ok.rps == ok.line_rps < ok.prefill_rps


def test_line_price_per_gbps_month_and_which_price_wins() -> None:
    line = LinkSpec(bandwidth_gbps=20, rtt_s=0.03, price_per_gbps_month=73.0)
    assert line.hourly_price() == pytest.approx(2.0)  # 20 x 73 / 730 h
    both = LinkSpec(bandwidth_gbps=20, rtt_s=0.03, price_per_gbps_month=73.0, price_per_hour=5)
    assert both.hourly_price() == 5.0  # an explicit hourly price wins
    packaged = load_preset("pdd-small", ROOFLINE)
    assert packaged.cost_per_hour() == pytest.approx(117.5 + 20 * 72.4 / 730)
    old = load_preset("pdd-small", ROOFLINE | {"links.wan.price_per_hour": 1.0})  # an older preset
    assert old.cost_per_hour() == pytest.approx(118.5)
    assert line_price_of(old) == pytest.approx(1.0 * 730 / 20)  # spread over its 20 Gbps


def test_counts_parse_ranges_and_name_the_option() -> None:
    assert parse_counts("2..4,7", "--p") == (2, 3, 4, 7)
    with pytest.raises(UserError, match="--md"):
        parse_counts("3..1", "--md")


def test_pruning_by_bounds_and_by_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """1 prefill instance cannot serve the trace's rate (pruned by its bound); 2 are
    measured; 3 cost more and can at best serve what 2 already do: dominated, never
    measured. The best is confirmed over both seeds on the full window."""
    measured: list[CapacityJob] = []

    def fake_capacity(job: CapacityJob) -> CapacityResult:
        measured.append(job)
        return CapacityResult(
            capacity_req_s=50.0, capacity_low_req_s=49.0, capacity_high_req_s=51.0,
            sla_goodput_req_s=47.5, sla_goodput_low_req_s=46.0, sla_goodput_high_req_s=49.0,
            per_seed_req_s=[50.0], bracketed=True, monotone=True, probes=[], warnings=[],
        )  # fmt: skip

    monkeypatch.setattr(plan_module, "run_capacity_job", fake_capacity)
    load = cold_load(n=100, prompt=10_000, output=101)  # 1 req/s of cold 10K prompts
    space = PlanSpace(
        p=(1, 2, 3), rld=(1,), md=(1,), gpu_p=("h100",), gpu_rld=("h100",), gpu_md=("h200",),
        wan_gbps=(400.0,), wan_price_per_gbps_month=72.4,
    )  # fmt: skip
    # 100 prompts of 0.2455 s: 1 instance bounds 100 / (24.5 - 1) = 4.25 req/s, 2 give 8.87,
    # 3 give 13.9; the target is 5 req/s (the trace's 1 req/s x 5)
    settings = PlanSettings(
        trace="t",
        preset="pdd-small",
        policy="pdd",
        min_rate_scale=5.0,
        target=1.0,
        replay=ReplaySettings(
            overrides=ROOFLINE, sla_ttft_s=SLA.ttft_s, sla_tpot_ms=SLA.tpot_s * 1e3
        ),
    )
    plan = run_plan(settings, space, load, SerialExecutor(), baseline=False)
    by_p = {r.candidate.p: r for r in plan.results if r.candidate is not None}
    assert by_p[1].pruned_by == "prefill"
    assert by_p[1].bounds.rps == pytest.approx(4.25, rel=1e-2)
    assert by_p[2].bounds.rps == pytest.approx(8.87, rel=1e-2)
    assert by_p[2].status == "confirmed"
    assert by_p[3].bounds.rps <= 50.0
    assert by_p[3].pruned_by == "dominated"
    screened, confirmed = measured
    assert screened.replay.overrides["pools.p.instances"] == 2
    assert screened.settings.seeds == (0,)
    assert screened.settings.start_req_s == pytest.approx(5.0)  # the target rate
    assert screened.window.window_s < confirmed.window.window_s
    assert confirmed.settings.seeds == (0, 1)
    assert confirmed.settings.tolerance == 0.02
    assert plan.pruned_by() == {"prefill": 1, "dominated": 1}
    assert plan.front == [plan.results.index(by_p[2])]
    assert plan.best == {"pdd": plan.front[0]}


def test_a_runner_up_the_screening_cannot_tell_apart_is_confirmed_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """2 and 3 prefill instances screen 5% apart in BCR (within the 10% tolerance): both
    are confirmed, and the one whose confirmed BCR is higher is the best."""
    screen_bcr = {2: 0.100, 3: 0.095}  # req/s per USD/h
    confirmed_bcr = {2: 0.090, 3: 0.100}

    def fake_capacity(job: CapacityJob) -> CapacityResult:
        p = job.replay.overrides["pools.p.instances"]
        bcr = (screen_bcr if len(job.settings.seeds) == 1 else confirmed_bcr)[p]
        rate = bcr * load_preset(job.preset, job.replay.overrides).cost_per_hour()
        return CapacityResult(
            capacity_req_s=rate, capacity_low_req_s=rate, capacity_high_req_s=rate,
            sla_goodput_req_s=rate, sla_goodput_low_req_s=rate, sla_goodput_high_req_s=rate,
            per_seed_req_s=[rate], bracketed=True, monotone=True, probes=[], warnings=[],
        )  # fmt: skip

    monkeypatch.setattr(plan_module, "run_capacity_job", fake_capacity)
    space = PlanSpace(
        p=(2, 3), rld=(1,), md=(1,), gpu_p=("h100",), gpu_rld=("h100",), gpu_md=("h200",),
        wan_gbps=(400.0,), wan_price_per_gbps_month=72.4,
    )  # fmt: skip
    settings = PlanSettings(
        trace="t", preset="pdd-small", policy="pdd", min_rate_scale=5.0, target=1.0,
        replay=ReplaySettings(overrides=ROOFLINE, sla_ttft_s=SLA.ttft_s,
                              sla_tpot_ms=SLA.tpot_s * 1e3),
    )  # fmt: skip
    plan = run_plan(settings, space, cold_load(n=100), SerialExecutor(), baseline=False)
    by_p = {r.candidate.p: r for r in plan.results if r.candidate is not None}
    assert by_p[2].status == by_p[3].status == "confirmed"
    assert plan.best == {"pdd": plan.results.index(by_p[3])}
    assert by_p[3].bcr_per_1000_usd_h == pytest.approx(100.0)

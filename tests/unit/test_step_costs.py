"""Where a pool's step costs come from: the performance database, a calibration, or the
roofline, and what the database's prices look like for the packaged presets."""

from __future__ import annotations

import pytest

from replay.presets.loader import load_preset
from replay.presets.schema import FittedTiming
from replay.sim.perfdb_costs import PerfDbCosts
from replay.sim.roofline import Roofline
from replay.sim.step_costs import resolve_step_costs
from router.errors import UserError

FITTED = {
    "prefill_overhead_s": 0.001, "prefill_s_per_token": 1e-6, "prefill_s_per_token_pair": 0.0,
    "decode_overhead_s": 0.002, "decode_s_per_request": 0.0, "decode_s_per_context_token": 0.0,
}  # fmt: skip


def test_auto_takes_the_database_where_it_covers_the_gpu_model_and_engine() -> None:
    resolved = resolve_step_costs(load_preset("pdd-small"), "md")
    assert resolved.source == "perfdb"
    assert isinstance(resolved.costs, PerfDbCosts)
    assert "moonshotai/Kimi-K2-Instruct on h200_sxm, vllm, TP8 EP8" in resolved.describe()


def test_auto_falls_back_to_the_roofline_and_says_why() -> None:
    # 64 attention heads cannot be split over the RLD pool's 3 GPUs
    rld = resolve_step_costs(load_preset("pdd-small"), "rld")
    assert rld.source == "roofline"
    assert isinstance(rld.costs, Roofline)
    assert "a shape outside its tables: num_heads 64 should be divisible by tp_size 3" in rld.detail
    assert "AssertionError" not in rld.detail  # the estimator's own exception is not shown
    # a GPU the database does not have (no perfdb_system)
    card = resolve_step_costs(load_preset("idc-pd-small", {"pools.p.hardware": "rtx-4090"}), "p")
    assert card.source == "roofline"
    assert "hardware 'rtx-4090' names no `perfdb_system`" in card.detail


def test_perfdb_asked_for_but_missing_is_one_clear_error() -> None:
    preset = load_preset("pdd-small", {"pools.rld.step_costs.source": "perfdb"})
    with pytest.raises(UserError, match=r"pool .rld.: step_costs\.source is perfdb but"):
        resolve_step_costs(preset, "rld")


def test_calibrated_wins_under_auto_and_needs_fitted_times() -> None:
    preset = load_preset("idc-pd-small", {"pools.md.fitted": FITTED})
    resolved = resolve_step_costs(preset, "md")
    assert resolved.source == "calibrated"
    fitted = FittedTiming(**FITTED)
    assert resolved.costs.decode_step_s(8, 8000.0) == pytest.approx(fitted.decode_step_s(8, 8000))
    # roofline asked for: the fitted times are not used
    asked = load_preset(
        "idc-pd-small", {"pools.md.fitted": FITTED, "pools.md.step_costs.source": "roofline"}
    )
    assert resolve_step_costs(asked, "md").costs.decode_step_s(8, 8000.0) > 0.01
    with pytest.raises(UserError, match=r"calibrated but the pool has no `fitted`"):
        load_preset("idc-pd-small", {"pools.md.step_costs.source": "calibrated"})


def test_database_prices_grow_with_work_and_the_h200_decodes_faster() -> None:
    preset = load_preset("pdd-small")
    p = resolve_step_costs(preset, "p").costs
    h200 = resolve_step_costs(preset, "md").costs
    h100 = resolve_step_costs(load_preset("idc-pd-small"), "md").costs
    # prefill: more new tokens cost more; a cached prefix costs less than computing it
    assert p.prefill_s([(8192, 0)]) > p.prefill_s([(2048, 0)]) > p.prefill_s([(512, 0)])
    assert p.prefill_s([(1024, 30_000)]) < p.prefill_s([(31_024, 0)]) / 4
    assert p.prefill_s([(1024, 60_000)]) > p.prefill_s([(1024, 0)])  # attention over it
    # two prompts in one pass cost less than two passes (weights and dispatch shared)
    two = p.prefill_s([(2048, 0), (2048, 0)])
    assert p.prefill_s([(2048, 0)]) < two < 2 * p.prefill_s([(2048, 0)])
    # decode: more requests and more context cost more; H200's bandwidth shows
    assert h100.decode_step_s(64, 64 * 8192) > h100.decode_step_s(8, 8 * 8192)
    assert h100.decode_step_s(64, 64 * 32_768) > h100.decode_step_s(64, 64 * 4096)
    assert h100.decode_step_s(64, 64 * 8192) > h200.decode_step_s(64, 64 * 8192)
    # a chunked-prefill step is one pass: more than either part, less than both
    chunk, decode = p.prefill_s([(2048, 4096)]), p.decode_step_s(32, 32 * 8192)
    mixed = p.mixed_step_s(32, 32 * 8192, 2048, 4096)
    assert max(chunk, decode) <= mixed < chunk + decode


def test_step_overheads_are_added_as_the_preset_says() -> None:
    base = resolve_step_costs(load_preset("idc-pd-small"), "md").costs
    extra = {"pools.md.step_costs.step_overhead_s": 0.005}
    slower = resolve_step_costs(load_preset("idc-pd-small", extra), "md").costs
    assert slower.decode_step_s(16, 16 * 4096) - base.decode_step_s(16, 16 * 4096) == (
        pytest.approx(0.005)
    )
    # vLLM's per-layer dispatch (61 layers at 0.8 ms) before each request's prefill, unless
    # set: latency, not engine time
    none = {"pools.md.step_costs.dispatch_s_per_layer": 0.0}
    bare = resolve_step_costs(load_preset("idc-pd-small", none), "md").costs
    assert base.dispatch_s == pytest.approx(61 * 0.8e-3)
    assert bare.dispatch_s == 0.0
    assert base.prefill_s([(1024, 0)]) == bare.prefill_s([(1024, 0)])


def test_database_settings_on_a_pool_priced_otherwise_are_named_as_unused() -> None:
    preset = load_preset("pdd-small", {"pools.rld.step_costs.step_overhead_s": 0.002,
                                       "pools.rld.step_costs.engine": "sglang"})  # fmt: skip
    rld = resolve_step_costs(preset, "rld")
    assert rld.source == "roofline"
    assert rld.detail.endswith("; step_costs.engine, step_costs.step_overhead_s unused here")
    assert "unused" not in resolve_step_costs(load_preset("pdd-small"), "rld").detail

"""The replay configuration: refusals name the bad field, and a run's summary.json holds
its configuration whole, so the run can be made again from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from replay.metrics import write_run
from replay.runner.config import ReplayConfig, ReplaySettings
from replay.runner.run import run_replay
from replay.trace.synth import make_profile, write_synthetic_trace


@pytest.mark.parametrize(
    ("fields", "bad"),
    [
        ({"rate_scale": 0}, "rate_scale"),
        ({"rate_scale": float("inf")}, "rate_scale"),
        ({"kv_event_delay_s": -0.1}, "kv_event_delay_s"),
        ({"index_mode": "guess"}, "index_mode"),
        ({"index_capacity": "some"}, "index_capacity"),
        ({"max_requests": 0}, "max_requests"),
        ({"sla_tpot_ms": 0}, "sla_tpot_ms"),
        ({"seeds": 3}, "seeds"),
    ],
)
def test_a_bad_value_is_refused_by_its_field(fields: dict[str, object], bad: str) -> None:
    with pytest.raises(ValidationError) as info:
        ReplayConfig(trace="t.jsonl", preset="pdd-small", **fields)
    assert [e["loc"][0] for e in info.value.errors()] == [bad]


def test_the_sla_is_given_in_the_units_the_tables_show() -> None:
    settings = ReplaySettings(sla_ttft_s=2.0, sla_tpot_ms=70.0)
    assert settings.sla.ttft_s == 2.0
    assert settings.sla.tpot_s == 0.07


def test_one_replay_of_shared_settings_keeps_them_and_sets_its_own() -> None:
    shared = ReplaySettings(seed=4, index_mode="approximate", overrides={"pools.md.instances": 2})
    one = shared.replay("t.jsonl", "pdd-small", "pdd", {"wan_budget_s": 0.5}, rate_scale=2.0)
    assert (one.seed, one.index_mode, one.overrides) == (4, "approximate", shared.overrides)
    assert (one.policy, one.policy_params, one.rate_scale) == ("pdd", {"wan_budget_s": 0.5}, 2.0)
    assert one.settings == shared.model_copy(update={"rate_scale": 2.0})


def test_a_run_is_made_again_from_its_summary(tmp_path: Path) -> None:
    trace = tmp_path / "agentic.jsonl"
    write_synthetic_trace(trace, make_profile("agentic"), 80, seed=5)
    config = ReplayConfig(
        trace=str(trace), preset="pdd-small", policy="pdd", policy_params={"wan_budget_s": 0.4},
        overrides={"pools.md.instances": 2}, rate_scale=1.5, seed=7, max_requests=60,
        kv_event_wan_delay_s=0.02, sla_ttft_s=3.0, sla_tpot_ms=80.0, index_mode="approximate",
        index_capacity="unbounded",
    )  # fmt: skip
    first = run_replay(config)
    write_run(tmp_path / "run", first.summary, first.records)
    recorded = json.loads((tmp_path / "run" / "summary.json").read_text())
    rebuilt = ReplayConfig.model_validate(recorded["config"])
    assert rebuilt == config
    again = run_replay(rebuilt).summary
    assert again.requests == 60
    assert again.sla.tpot_s == 0.08
    same = {"wall_s": 0.0}
    assert again.model_copy(update=same) == first.summary.model_copy(update=same)

"""What runs short: the binding resource judged from a summary's rejections and load, and
the `replay plan` command that sizes it."""

from __future__ import annotations

from typing import Any

import pytest

from replay.metrics.binding import find_binding
from replay.metrics.summary import Percentiles, Summary
from replay.runner.config import ReplayConfig
from replay.runner.run import run_replay
from replay.trace.record import TraceRequest

ONE = TraceRequest(0, 1.0, 3000, 200, tuple(range(6)), 512)


@pytest.fixture(scope="module")
def pdd() -> Summary:
    """A run that meets its SLA on pdd-small (3 P, 1 RLD, 2 MD, a 20 Gbps line)."""
    return run_replay(ReplayConfig(trace="<memory>", preset="pdd-small"), requests=[ONE]).summary


def _as(summary: Summary, **update: Any) -> Summary:
    return summary.model_copy(update={"trace": "agentic.jsonl", **update})


def test_a_run_within_its_sla_binds_nothing(pdd: Summary) -> None:
    assert pdd.binding is None
    assert find_binding(_as(pdd, sla_attainment=0.95)) is None  # 5% missed: not more


def test_rejections_for_the_line_name_the_line_and_widen_it(pdd: Summary) -> None:
    binding = find_binding(
        _as(pdd, requests=200, rejected=27, rejected_by={"wan": 20, "prefill": 7},
            sla_attainment=0.85, wan_utilization=0.85)
    )  # fmt: skip
    assert binding is not None
    assert binding.resource == "line"
    assert "20 of 200 requests (10.0%) rejected" in binding.reason
    assert "a mean 85% of 20 Gbps" in binding.reason
    assert binding.plan_command == (
        "pdd-router replay plan agentic.jsonl --preset pdd-small --wan-gbps 20,40,80"
    )


def test_relay_decode_rejections_tell_memory_from_compute(pdd: Summary) -> None:
    rejected = {"requests": 100, "rejected": 9, "rejected_by": {"rld": 9}, "sla_attainment": 0.9}
    full = find_binding(_as(pdd, **rejected, kv_used={"rld": 0.95}, utilization={"rld": 0.6}))
    busy = find_binding(_as(pdd, **rejected, kv_used={"rld": 0.3}, utilization={"rld": 0.99}))
    assert full is not None
    assert busy is not None
    assert (full.resource, busy.resource) == ("rld-memory", "rld-compute")
    assert full.plan_command.endswith("--rld 1..2")


def test_without_rejections_the_most_loaded_resource_binds(pdd: Summary) -> None:
    loaded = {"p": 0.97, "rld": 0.5, "md": 0.99}
    binding = find_binding(
        _as(pdd, sla_attainment=0.8, utilization=loaded, kv_used={"md": 0.2}, wan_utilization=0.4)
    )
    # MD's batch is busy but TPOT meets its limit: its compute is not what is short
    assert binding is not None
    assert binding.resource == "prefill"
    assert binding.plan_command.endswith("--preset pdd-small --p 3..6")
    slow = Percentiles(p50=0.08, p90=0.15, p99=0.2, mean=0.09)
    binding = find_binding(
        _as(pdd, sla_attainment=0.8, utilization=loaded, tpot_s=slow, wan_utilization=0.4)
    )
    assert binding is not None
    assert binding.resource == "md-compute"
    assert binding.plan_command.endswith("--md 2..4")


def test_the_run_overrides_go_to_plan_and_other_deployments_get_plan_own_base(
    pdd: Summary,
) -> None:
    short = {"sla_attainment": 0.5, "utilization": {"p": 0.99}, "wan_utilization": 0.1}
    binding = find_binding(_as(pdd, **short, overrides={"pools.p.instances": 3}))
    assert binding is not None
    assert "--preset pdd-small --set pools.p.instances=3 --p 3..6" in binding.plan_command
    idc = run_replay(ReplayConfig(trace="<memory>", preset="idc-pd-small"), requests=[ONE]).summary
    binding = find_binding(_as(idc, **short))
    assert binding is not None
    assert binding.resource == "prefill"
    assert binding.plan_command == "pdd-router replay plan agentic.jsonl"

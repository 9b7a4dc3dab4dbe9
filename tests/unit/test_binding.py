"""What runs short: the binding resource judged from a summary's rejections and load, and
the `replay plan` command that sizes it."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from replay.metrics.binding import find_binding
from replay.metrics.columns import float_values
from replay.metrics.summary import Percentiles, Summary, ttft_missed_split
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


def test_the_ttft_of_requests_past_its_limit_is_split_by_where_it_went() -> None:
    served = run_replay(ReplayConfig(trace="<memory>", preset="pdd-small"), requests=[ONE])
    (record,) = served.records
    assert ttft_missed_split([record], limit_s=10.0) == {}  # met its limit: nothing to split
    waited = dataclasses.replace(record, pipeline="P-MD", ttft_s=12.0, prefill_queue_s=0.5,
                                 prefill_s=0.3, transfer_s=0.2)  # fmt: skip
    queued = dataclasses.replace(record, pipeline="P-MD", ttft_s=16.0, prefill_queue_s=14.0,
                                 prefill_s=0.4, transfer_s=None)  # fmt: skip
    # its first token from RLD: the copy to MD (transfer_s) is off its first token's path
    relayed = dataclasses.replace(record, pipeline="P-RLD-MD", ttft_s=11.0,
                                  prefill_queue_s=1.0, prefill_s=0.5, transfer_s=3.0)  # fmt: skip
    split = ttft_missed_split([waited, queued, record, relayed], limit_s=10.0)
    assert split == pytest.approx(
        {
            "requests": 3,
            "ttft": 13.0,
            "prefill_queue": 15.5 / 3,
            "prefill": 1.2 / 3,
            "line": 0.2 / 3,
            "decode": (11.0 + 1.6 + 9.5) / 3,
            "decode_md": 12.6 / 3,
            "decode_rld": 9.5 / 3,
        },
        abs=1e-6,
    )  # fmt: skip  (rounded to the microsecond, as summary.json is)


def test_requests_waiting_for_a_decode_instance_name_the_decode_pool(pdd: Summary) -> None:
    """Prefill idle, the line quiet, TPOT within its limit, yet first tokens come late: the
    requests waited for MD after their KV arrived. Naming prefill (the most loaded by busy
    time) would send the user to size the wrong pool."""
    figures = {"sla_attainment": 0.6, "utilization": {"p": 0.28, "rld": 0.02, "md": 1.0},
               "kv_used": {"md": 0.08}, "wan_utilization": 0.14}  # fmt: skip
    split = {"requests": 400, "ttft": 22.3, "prefill_queue": 0.1, "prefill": 0.3, "line": 0.1,
             "decode": 21.8, "decode_md": 21.8, "decode_rld": 0.0}  # fmt: skip
    late = {**figures, "requests": 1000}
    binding = find_binding(_as(pdd, **late, ttft_missed_split_s=split))
    assert binding is not None
    assert binding.resource == "md-compute"
    assert (
        "the 400 requests that missed the TTFT limit waited 21.8 s of their 22.3 s to "
        "first token on MD" in binding.reason
    )
    assert binding.plan_command.endswith("--md 2..4")
    on_rld = {**split, "decode_md": 1.0, "decode_rld": 20.8}  # late first tokens from RLD
    binding = find_binding(_as(pdd, **late, ttft_missed_split_s=on_rld))
    assert binding is not None
    assert binding.resource == "rld-compute"
    assert binding.plan_command.endswith("--rld 1..2")
    queued = {**split, "prefill_queue": 20.0, "decode": 1.9, "decode_md": 1.9}
    binding = find_binding(_as(pdd, **late, ttft_missed_split_s=queued))
    assert binding is not None
    assert binding.resource == "prefill"  # the prefill queue's doing
    few = {**split, "requests": 50}  # 50 late of 400 that missed the SLA: TPOT's doing
    binding = find_binding(_as(pdd, **late, ttft_missed_split_s=few))
    assert binding is not None
    assert binding.resource == "prefill"


def test_rejections_for_a_full_main_decode_name_its_pool(pdd: Summary) -> None:
    rejected = {"requests": 100, "rejected": 9, "rejected_by": {"md": 8, "prefill": 1}}
    binding = find_binding(_as(pdd, **rejected, sla_attainment=0.9, kv_used={"md": 0.1},
                               utilization={"p": 0.3, "md": 1.0}))  # fmt: skip
    assert binding is not None
    assert binding.resource == "md-compute"
    assert "8 of 100 requests (8.0%) rejected with main decode full" in binding.reason
    assert binding.plan_command.endswith("--md 2..4")


def test_the_split_reads_a_replays_own_columns_as_it_reads_records() -> None:
    """A replay's records are columns: the split finds each one's pipeline there without
    building a record per row, and agrees with the same records as objects."""
    trace = [TraceRequest(i, 0.1 * i, 3000, 200, tuple(range(6 * i, 6 * i + 6)), 512)
             for i in range(40)]  # fmt: skip
    result = run_replay(ReplayConfig(trace="<memory>", preset="pdd-small"), requests=trace)
    as_objects = list(result.records)
    limit = float(np.median(float_values(as_objects, "ttft_s")))  # about half are "late"
    split = ttft_missed_split(result.records, limit)
    assert split["requests"] >= 1
    assert split == ttft_missed_split(as_objects, limit)

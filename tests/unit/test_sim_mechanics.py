"""Pipelines executed by the simulator: DRC deltas, the handoff, odd traffic, KV events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from policies.tiers import Tier
from policies.types import ClusterView, Decision, HandoffMode, Pipeline, RequestView
from replay.metrics import RequestRecord, record_of
from replay.presets import load_preset
from replay.sim.event_loop import EventLoop
from replay.sim.sim_settings import SimSettings
from replay.sim.simulator import Simulator
from replay.trace.record import TraceRequest
from router.index.memory_index import MemoryPrefixIndex

BLOCK = 512
KV = 70_272  # bytes per token of the kimi-k2-like preset


def _req(rid: int, at: float, blocks: list[int], output: int) -> TraceRequest:
    return TraceRequest(rid, at, len(blocks) * BLOCK, output, tuple(blocks), BLOCK)


class Scripted:
    """A stand-in scheduler: one fixed decision (or a function of the request)."""

    def __init__(self, decide: Callable[[RequestView], Decision]) -> None:
        self._decide = decide
        self.seen: list[tuple[RequestView, dict[str, Any]]] = []

    def decide(self, request: RequestView, cluster: ClusterView) -> Decision:
        loads = {
            load.instance_id: (load.running, load.queued, load.kv_used_tokens)
            for pool in cluster.instances.values()
            for load in pool
        }
        self.seen.append((request, {"loads": loads, "now": cluster.now}))
        return self._decide(request)


def _decision(pipeline: Pipeline, **kw: Any) -> Decision:
    ids = {Pipeline.P_MD: ("md-0", None), Pipeline.P_RLD: (None, "rld-0")}
    md, rld = ids.get(pipeline, ("md-0", "rld-0"))
    return Decision(
        policy="scripted",
        pipeline=pipeline,
        p_instance="p-0",
        md_instance=md,
        rld_instance=rld,
        **kw,
    )


def _run(
    trace: list[TraceRequest],
    decide: Callable[[RequestView], Decision],
    *,
    wan_gbps: float = 20.0,
    delay: float = 0.0,
) -> tuple[list[RequestRecord], Simulator, Scripted]:
    preset = load_preset(
        "pdd-small",
        {"pools.p.instances": 1, "pools.md.instances": 1, "links.wan.bandwidth_gbps": wan_gbps},
    )
    loop = EventLoop()
    index = MemoryPrefixIndex(clock=loop.clock)
    decider = Scripted(decide)
    sim = Simulator(
        preset,
        decider,
        index,
        block_size=BLOCK,
        settings=SimSettings(kv_event_delay_s=delay),
        loop=loop,
    )
    requests = sim.run(trace)
    return [record_of(r) for r in requests], sim, decider


def test_p_md_with_a_warm_md_cache_ships_only_the_delta() -> None:
    first = _req(0, 0.0, list(range(20)), output=10)
    second = _req(1, 60.0, [*range(20), 100, 101, 102, 103], output=10)
    records, sim, _ = _run([first, second], lambda r: _decision(Pipeline.P_MD))
    assert records[0].wan_bytes == 20 * BLOCK * KV
    assert records[1].wan_bytes == 4 * BLOCK * KV
    assert records[1].hit_md == pytest.approx(20 / 24)
    assert records[1].hit_p == pytest.approx(20 / 24)
    assert sim.cluster.wan is not None
    assert sim.cluster.wan.bytes_sent == 24 * BLOCK * KV


def test_p_md_without_drc_ships_the_full_prompt() -> None:
    first = _req(0, 0.0, list(range(20)), output=10)
    second = _req(1, 60.0, [*range(20), 100, 101, 102, 103], output=10)
    records, _, _ = _run([first, second], lambda r: _decision(Pipeline.P_MD, reuse_md_cache=False))
    assert records[1].wan_bytes == 24 * BLOCK * KV
    assert records[1].hit_md == 0.0


def _long(output: int) -> list[TraceRequest]:
    return [_req(0, 0.0, list(range(64)), output=output)]  # 32K tokens, 2.3 GB of KV


def test_p_rld_md_answers_at_local_speed_while_the_wan_is_slow_then_hands_off() -> None:
    slow_wan = 2.0  # Gbps: the 2.3 GB copy takes about 9 s
    p_md, _, _ = _run(_long(2000), lambda r: _decision(Pipeline.P_MD), wan_gbps=slow_wan)
    relay, _, _ = _run(
        _long(2000),
        lambda r: _decision(Pipeline.P_RLD_MD, handoff=HandoffMode.ONE_SHOT),
        wan_gbps=slow_wan,
    )
    direct, relayed = p_md[0], relay[0]
    assert direct.ttft_s is not None
    assert relayed.ttft_s is not None
    assert direct.ttft_s > 9.0
    assert relayed.ttft_s < direct.ttft_s - 8.0
    assert relayed.ttft_s == pytest.approx(relayed.prefill_queue_s + relayed.prefill_s, abs=0.2)
    assert relayed.pipeline == "P-RLD-MD"
    assert relayed.handoff == "one-shot"
    assert relayed.finished_on == "md-0"
    assert relayed.eager_tokens == relayed.tokens_rld > 100
    assert relayed.tokens_rld + relayed.tokens_md == 2000
    assert relayed.wan_bytes == 64 * BLOCK * KV


def test_one_shot_shows_one_larger_gap_and_catch_up_keeps_rld_busy_longer() -> None:
    runs = {}
    for mode in (HandoffMode.ONE_SHOT, HandoffMode.CATCH_UP):

        def decide(_: RequestView, m: HandoffMode = mode) -> Decision:
            return _decision(Pipeline.P_RLD_MD, handoff=m, chunk_tokens=64)

        records, _, _ = _run(_long(2000), decide, wan_gbps=2.0)
        runs[mode] = records[0]
    one_shot, catch_up = runs[HandoffMode.ONE_SHOT], runs[HandoffMode.CATCH_UP]
    assert one_shot.handoff_gap_s is not None
    assert catch_up.handoff_gap_s is not None
    assert one_shot.max_gap_s is not None
    assert catch_up.max_gap_s is not None
    assert one_shot.handoff_gap_s > 2 * catch_up.handoff_gap_s
    assert one_shot.max_gap_s > catch_up.max_gap_s
    assert catch_up.handoff_rounds >= 2
    assert one_shot.rld_busy_s is not None
    assert catch_up.rld_busy_s is not None
    assert catch_up.rld_busy_s > one_shot.rld_busy_s
    assert catch_up.tokens_rld > one_shot.tokens_rld
    for record in (one_shot, catch_up):
        assert record.tokens_rld + record.tokens_md == 2000


def test_odd_traffic_finishes_on_rld_and_cancels_the_wan_copy() -> None:
    records, sim, _ = _run(
        _long(50),
        lambda r: _decision(Pipeline.P_RLD_MD, handoff=HandoffMode.ONE_SHOT),
        wan_gbps=2.0,
    )
    odd = records[0]
    assert odd.pipeline == "P-RLD"
    assert odd.decided_pipeline == "P-RLD-MD"
    assert odd.reactive
    assert odd.finished_on == "rld-0"
    assert odd.tokens_rld == 50
    assert odd.tokens_md == 0
    assert 0 < odd.wan_bytes < 64 * BLOCK * KV  # part of the copy had crossed
    wan = sim.cluster.wan
    assert wan is not None
    assert wan.sync_state().active_transfers == 0
    md = sim.cluster.decode["md-0"]
    assert md.cache.pinned_tokens == 0  # its reservation was given back


def test_p_rld_decided_up_front_sends_nothing_over_the_wan() -> None:
    records, sim, _ = _run(_long(50), lambda r: _decision(Pipeline.P_RLD))
    assert records[0].pipeline == "P-RLD"
    assert not records[0].reactive
    assert records[0].wan_bytes == 0
    assert sim.cluster.wan is not None
    assert sim.cluster.wan.bytes_sent == 0


def test_the_index_learns_of_cached_blocks_only_after_the_kv_event_delay() -> None:
    chain = list(range(8))
    preset = load_preset("pdd-small", {"pools.p.instances": 1, "pools.md.instances": 1})
    loop = EventLoop()
    index = MemoryPrefixIndex(clock=loop.clock)
    sim = Simulator(
        preset,
        Scripted(lambda r: _decision(Pipeline.P_MD)),
        index,
        block_size=BLOCK,
        settings=SimSettings(kv_event_delay_s=0.5),
        loop=loop,
    )
    sim.start([_req(0, 0.0, chain, output=5)])
    p = sim.cluster.prefill["p-0"]
    # the engine takes the request after its dispatch, then prefills it
    prefill_s = p.step_costs.dispatch_s + p.step_costs.prefill_s([(len(chain) * BLOCK, 0)])
    loop.run(until=prefill_s + 0.49)
    assert p.cache.leading_blocks(chain) == 8  # the engine holds it...
    assert index.match(chain, tier=Tier.P)["p-0"] == 0  # ...the router does not know yet
    loop.run(until=prefill_s + 0.51)
    assert index.match(chain, tier=Tier.P)["p-0"] == 8
    loop.run()
    assert index.match(chain, tier=Tier.MD)["md-0"] == 8  # MD's copy was reported too


def test_the_scheduler_sees_live_load_in_the_cluster_view() -> None:
    trace = [_req(i, 0.0, [1000 * i + b for b in range(32)], output=200) for i in range(4)]
    _, _, decider = _run(trace, lambda r: _decision(Pipeline.P_MD))
    queued = [seen["loads"]["p-0"][1] + seen["loads"]["p-0"][0] for _, seen in decider.seen]
    assert queued == [0, 1, 2, 3]  # each arrival sees the ones before it at P


@pytest.mark.parametrize("allocation", ["on-demand", "reserve-output"])
def test_a_busy_mixed_run_finishes_everything_and_leaks_nothing(allocation: str) -> None:
    """Every pipeline and handoff mode under memory and batch pressure, then nothing is left
    (with on-demand memory, requests are preempted on the way)."""
    import random

    rng = random.Random(11)
    trace = []
    for i in range(300):
        session = rng.randrange(12)
        shared = [session * 10_000 + b for b in range(rng.randrange(1, 40))]
        tail = [1_000_000 + i * 100 + b for b in range(rng.randrange(1, 30))]
        trace.append(_req(i, i * 0.05, shared + tail, output=rng.choice([1, 5, 60, 400, 1500])))
    choices = [
        _decision(Pipeline.P_MD),
        _decision(Pipeline.P_MD, reuse_md_cache=False),
        _decision(Pipeline.P_RLD),
        _decision(Pipeline.P_RLD_MD, handoff=HandoffMode.ONE_SHOT),
        _decision(Pipeline.P_RLD_MD, handoff=HandoffMode.CATCH_UP, chunk_tokens=16),
    ]
    picks = iter(rng.choice(choices) for _ in range(len(trace)))
    preset = load_preset(
        "pdd-small",
        {
            "pools.rld.kv_capacity_tokens": 80_000,
            "pools.rld.max_batch": 4,
            "pools.md.max_batch": 8,
            "pools.md.kv_capacity_tokens": 150_000,
            "pools.p.kv_capacity_tokens": 120_000,
            "links.wan.bandwidth_gbps": 5,
            "links.wan.fluctuation": {"period_s": 1.0, "low": 0.2, "high": 1.0},
            "memory.allocation": allocation,
        },
    )
    loop = EventLoop()
    index = MemoryPrefixIndex(clock=loop.clock)
    sim = Simulator(
        preset,
        Scripted(lambda r: next(picks)),
        index,
        block_size=BLOCK,
        settings=SimSettings(kv_event_delay_s=0.05),
        loop=loop,
    )
    records = [record_of(r) for r in sim.run(trace)]
    assert all(r.e2e_s is not None for r in records)
    assert all(r.tokens_rld + r.tokens_md == r.output_length for r in records)
    assert {r.pipeline for r in records} == {"P-MD", "P-RLD", "P-RLD-MD"}
    assert any(r.reactive for r in records)
    assert {r.handoff for r in records} >= {"one-shot", "catch-up"}
    preempted = sum(r.preemptions for r in records)
    assert (preempted > 0) == (allocation == "on-demand")
    for p in sim.cluster.prefill.values():
        assert p.cache.pinned_tokens == 0, p.id
        assert p.load.running == p.load.queued == 0, p.id
    for d in sim.cluster.decode.values():  # generated tokens are a fluid count: ~0
        assert d.cache.pinned_tokens == pytest.approx(0.0, abs=1e-6), d.id
        assert d.load.running == d.load.queued == 0, d.id
    for link in sim.cluster.links:
        assert link.sync_state().active_transfers == 0
    assert loop.pending() == 0

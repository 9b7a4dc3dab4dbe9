"""Edge cases of decode memory taken on demand: a stale "memory full" event, a handoff to MD
while the RLD copy is preempted, a request too long to take back, a closed queue head,
and a colocated engine's recomputed tokens (each once broke a replay)."""

from __future__ import annotations

from typing import Any

import pytest

from policies.types import ClusterView, Decision, HandoffMode, Pipeline, RequestView
from replay.presets import load_preset
from replay.runner.trace_source import CheckedTrace
from replay.sim.colocated_instance import ColocatedInstance
from replay.sim.event_loop import EventLoop
from replay.sim.request_state import SimRequest
from replay.sim.simulator import Simulator
from replay.trace.record import TraceRequest
from router.errors import UserError
from router.index.memory_index import MemoryPrefixIndex

BLOCK = 512


class Scripted:
    """P-RLD-MD one-shot for the requests named, P-MD for the others."""

    def __init__(self, handoff: set[str]) -> None:
        self.handoff = handoff

    def decide(self, request: RequestView, cluster: ClusterView) -> Decision:
        if request.request_id in self.handoff:
            return Decision(policy="s", pipeline=Pipeline.P_RLD_MD, p_instance="p-0",
                            rld_instance="rld-0", md_instance="md-0",
                            handoff=HandoffMode.ONE_SHOT)  # fmt: skip
        return Decision(policy="s", pipeline=Pipeline.P_MD, p_instance="p-0", md_instance="md-0")


def _run(
    trace: list[TraceRequest], handoff: set[str], **overrides: Any
) -> tuple[list[SimRequest], Simulator]:
    preset = load_preset("pdd-small", {"pools.p.instances": 1, "pools.md.instances": 1,
                                       "links.wan.fluctuation": None, **overrides})  # fmt: skip
    loop = EventLoop()
    index = MemoryPrefixIndex(clock=loop.clock)
    sim = Simulator(preset, Scripted(handoff), index, block_size=BLOCK, loop=loop)
    return sim.run(trace), sim


def test_memory_freed_elsewhere_cancels_the_moment_it_would_have_filled() -> None:
    """A and B never need more than about 6,200 of md-0's 20,000 tokens; C's 15,000-token
    copy reserved there and then dropped (RLD finished C first) must not leave behind a
    'memory full' event that preempts B."""
    trace = [
        TraceRequest(0, 0.0, 100, 3000, (), BLOCK),
        TraceRequest(1, 0.0, 100, 3000, (), BLOCK),
        TraceRequest(2, 5.0, 15000, 2, (), BLOCK),
    ]
    requests, sim = _run(
        trace, {"2"}, **{"pools.md.kv_capacity_tokens": 20000, "links.wan.bandwidth_gbps": 1}
    )
    assert sim.cluster.decode["md-0"].preemptions == 0
    assert [r.preemptions for r in requests] == [0, 0, 0]
    assert all(r.finished for r in requests)


def test_md_takes_over_from_a_preempted_rld_with_the_tokens_rld_emitted() -> None:
    """B is preempted on RLD after emitting some tokens; when its MD copy lands, MD takes
    over by the handoff (eager tokens shipped and extended), not from scratch."""
    trace = [
        TraceRequest(0, 0.0, 3000, 5000, (), BLOCK),
        TraceRequest(1, 0.01, 500, 5000, (), BLOCK),
    ]
    requests, _ = _run(
        trace, {"0", "1"},
        **{"pools.rld.instances": 1, "pools.rld.kv_capacity_tokens": 4040,
           "links.wan.bandwidth_gbps": 0.05},
    )  # fmt: skip
    preempted = requests[1]
    assert preempted.preemptions == 1
    assert preempted.tokens_rld > 0
    assert preempted.handoff is HandoffMode.ONE_SHOT
    assert preempted.eager_tokens == preempted.tokens_rld
    assert preempted.md_have == preempted.tokens_rld
    assert preempted.tokens_rld + preempted.tokens_md == 5000


def test_a_request_too_long_to_take_back_is_never_preempted() -> None:
    """C reaches md-0 with about 10,000 generated tokens, more than md-0's 8,000 with its
    prompt: preempting it would lose it for good, so B (which fits) is preempted instead
    and everyone finishes, D (queued behind) too."""
    trace = [
        TraceRequest(0, 0.0, 1000, 20000, (), BLOCK),
        TraceRequest(1, 100.0, 50, 5000, (), BLOCK),
        TraceRequest(2, 150.0, 100, 10, (), BLOCK),
    ]
    requests, sim = _run(
        trace, {"0"},
        **{"pools.rld.instances": 1, "pools.md.kv_capacity_tokens": 8000,
           "pools.rld.kv_capacity_tokens": 100000, "links.wan.bandwidth_gbps": 0.005},
    )  # fmt: skip
    assert all(r.finished for r in requests)
    assert [r.emitted for r in requests] == [20000, 5000, 10]
    assert requests[0].preemptions == 0
    md = sim.cluster.decode["md-0"]
    assert md.load.running == md.load.queued == 0


@pytest.mark.parametrize("allocation", ["on-demand", "reserve-output"])
def test_the_copies_behind_a_closed_queue_head_start(allocation: str) -> None:
    """C's MD copy waits at the head of md-0's memory queue and is dropped when RLD
    finishes C; B and D, queued behind it, must then be served."""
    on_demand = allocation == "on-demand"
    trace = [
        TraceRequest(0, 0.0, 1000, 3000 if on_demand else 20000, (), BLOCK),
        TraceRequest(1, 1.0, 100, 50, (), BLOCK),
        TraceRequest(2, 2.0, 100, 10, (), BLOCK),
    ]
    requests, sim = _run(
        trace, {"0"},
        **{"pools.rld.instances": 1, "pools.rld.kv_capacity_tokens": 100000,
           "pools.md.kv_capacity_tokens": 900 if on_demand else 8000,
           "memory.allocation": allocation},
    )  # fmt: skip
    assert all(r.finished for r in requests)
    assert [r.emitted for r in requests[1:]] == [50, 10]
    assert sim.cluster.decode["md-0"].load.queued == 0


def test_a_recomputed_colocated_request_counts_its_generated_tokens_once() -> None:
    """After a recompute, the tokens a request had generated move from its reservation to
    the growing memory; counted in both, the engine saw up to 3,956 tokens too many."""
    trace = [
        TraceRequest(i, i * 0.01, 4 * BLOCK, 3000, tuple(100 * i + b for b in range(4)), BLOCK)
        for i in range(6)
    ]
    one_engine = {"pools.engines.instances": 1, "pools.engines.kv_capacity_tokens": 16384}
    preset = load_preset("colocated-small", one_engine)

    class Engine:
        def decide(self, request: RequestView, cluster: ClusterView) -> Decision:
            return Decision(policy="s", pipeline=Pipeline.COLOCATED, p_instance="engines-0")

    loop = EventLoop()
    sim = Simulator(preset, Engine(), MemoryPrefixIndex(clock=loop.clock), block_size=BLOCK,
                    loop=loop)  # fmt: skip
    engine = sim.cluster.prefill["engines-0"]
    assert isinstance(engine, ColocatedInstance)
    worst = 0.0
    decoded = engine._decoded

    def check(key: int) -> None:  # whenever a request ends: what the cache counts vs holds
        nonlocal worst
        if engine._growth is not None:
            engine._growth.refresh()
        held = 0.0
        for k in engine._admitted:
            r = engine._requests[k]
            progress = engine.batch.progress_of(k) if k in engine.batch else 0.0
            held += len(r.chain) * BLOCK + r.private_tokens + r.emitted + progress
        worst = max(worst, engine.cache.pinned_tokens - held)
        decoded(key)

    engine.batch._on_finish = check
    requests = sim.run(trace)
    assert engine.preemptions > 0
    assert all(r.finished for r in requests)
    assert worst == pytest.approx(0.0, abs=1.0)


def test_a_colocated_engine_that_reserves_outputs_refuses_a_request_it_cannot_hold() -> None:
    preset = load_preset("colocated-small", {"pools.engines.kv_capacity_tokens": 10000,
                                             "memory.allocation": "reserve-output"})  # fmt: skip
    trace = iter([TraceRequest(0, 0.0, 8 * BLOCK, 8000, tuple(range(8)), BLOCK)])
    with pytest.raises(UserError, match="holds 10000 KV tokens"):
        list(CheckedTrace(trace, preset))
    on_demand = load_preset("colocated-small", {"pools.engines.kv_capacity_tokens": 10000})
    trace = iter([TraceRequest(0, 0.0, 8 * BLOCK, 8000, tuple(range(8)), BLOCK)])
    assert len(list(CheckedTrace(trace, on_demand))) == 1


def test_an_engine_holds_whole_kv_blocks_of_its_capacity() -> None:
    """10,000 tokens of memory in blocks of 4,096 are two blocks: a request of 8,192 tokens
    (prompt and output) is held, one of 8,700 (which 10,000 tokens would hold, but not two
    blocks) is refused by name rather than left waiting forever."""
    overrides = {"pools.engines.kv_capacity_tokens": 10000, "pools.engines.kv_block_tokens": 4096,
                 "memory.allocation": "reserve-output"}  # fmt: skip
    preset = load_preset("colocated-small", overrides)
    assert preset.kv_capacity_tokens(preset.spec.pools["engines"]) == 8192
    fits = iter([TraceRequest(0, 0.0, 8 * BLOCK, 4096, tuple(range(8)), BLOCK)])
    assert len(list(CheckedTrace(fits, preset))) == 1
    too_long = iter([TraceRequest(0, 0.0, 8 * BLOCK, 4604, tuple(range(8)), BLOCK)])
    with pytest.raises(UserError, match="holds 8192 KV tokens"):
        list(CheckedTrace(too_long, preset))

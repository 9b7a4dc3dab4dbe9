"""Decode memory as engines manage it: taken as tokens are generated, preemption when full."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from policies.types import ClusterView, Decision, Pipeline, RequestView
from replay.metrics import RequestRecord, record_of
from replay.presets import load_preset
from replay.sim.event_loop import EventLoop
from replay.sim.events import Priority
from replay.sim.simulator import Simulator
from replay.trace.record import TraceRequest
from router.index.memory_index import MemoryPrefixIndex

BLOCK = 512
PROMPT_BLOCKS = 4  # 2,048 prompt tokens
OUTPUT = 3000
MD_CAPACITY = 16_384  # tokens: 8 prompts, but only 3 prompts with their whole output


class ToMd:
    def decide(self, request: RequestView, cluster: ClusterView) -> Decision:
        return Decision(policy="scripted", pipeline=Pipeline.P_MD, p_instance="p-0",
                        md_instance="md-0")  # fmt: skip


def _burst(n: int, gap_s: float = 0.0) -> list[TraceRequest]:
    chains = [tuple(1000 * i + b for b in range(PROMPT_BLOCKS)) for i in range(n)]
    return [
        TraceRequest(i, i * gap_s, PROMPT_BLOCKS * BLOCK, OUTPUT, chains[i], BLOCK)
        for i in range(n)
    ]


used: list[float] = []  # the MD's memory in use at each sample of the last run


def _run(
    trace: list[TraceRequest], allocation: str, **overrides: Any
) -> tuple[list[RequestRecord], Simulator, list[int]]:
    """Replay ``trace`` onto one MD; also the MD's running count sampled every 50 ms."""
    preset = load_preset(
        "pdd-small",
        {
            "pools.p.instances": 1,
            "pools.md.instances": 1,
            "pools.md.kv_capacity_tokens": MD_CAPACITY,
            "memory.allocation": allocation,
            **overrides,
        },
    )
    loop = EventLoop()
    sim = Simulator(preset, ToMd(), MemoryPrefixIndex(clock=loop.clock), block_size=BLOCK,
                    loop=loop)  # fmt: skip
    md = sim.cluster.decode["md-0"]
    running: list[int] = []
    used.clear()

    def sample(t: float) -> None:
        running.append(md.load.running)
        if md._growth is not None:  # memory in use, sampled (on demand it grows between events)
            md._growth.refresh()
        used.append(md.cache.pinned_tokens)
        if loop.pending():
            loop.after(0.05, Priority.SAMPLE, sample, t + 0.05)

    loop.at(0.0, Priority.SAMPLE, sample, 0.0)
    records = [record_of(r) for r in sim.run(trace)]
    return records, sim, running


def _assert_clean(records: list[RequestRecord], sim: Simulator) -> None:
    assert all(r.e2e_s is not None for r in records)
    assert all(r.tokens_md == r.output_length == OUTPUT for r in records)
    for p in sim.cluster.prefill.values():
        assert p.cache.pinned_tokens == 0, p.id
    for d in sim.cluster.decode.values():
        assert d.cache.pinned_tokens == pytest.approx(0.0, abs=1e-6), d.id
        assert d.load.running == d.load.queued == 0, d.id
    assert sim.loop.pending() == 0


def test_reserving_the_output_runs_only_what_fits_whole_and_never_preempts() -> None:
    records, sim, running = _run(_burst(6), "reserve-output")
    _assert_clean(records, sim)
    assert max(running) == 3  # 3 x (2,048 + 3,000) <= 16,384 < 4 x 5,048
    assert sim.cluster.decode["md-0"].preemptions == 0
    assert all(r.preemptions == 0 for r in records)


def test_on_demand_memory_admits_by_prompt_and_preempts_when_the_outputs_fill_it() -> None:
    records, sim, running = _run(_burst(6), "on-demand")
    _assert_clean(records, sim)
    assert max(running) == 6  # six prompts take 12,288 of 16,384 tokens: all start
    md = sim.cluster.decode["md-0"]
    assert md.preemptions > 0
    assert sum(r.preemptions for r in records) == md.preemptions
    # while they grow, the memory fills but is never overcommitted
    assert max(used) <= MD_CAPACITY + 1e-6
    assert max(used) > 0.9 * MD_CAPACITY


def test_preemption_takes_the_request_that_started_last() -> None:
    """vLLM's order: the oldest running request is never the one preempted, so it finishes
    first; later ones are freed and recomputed."""
    records, _, _ = _run(_burst(6, gap_s=0.05), "on-demand")
    finish = [r.arrival_s + (r.e2e_s or 0.0) for r in records]
    assert records[0].preemptions == 0
    assert records[-1].preemptions > 0
    assert finish[0] == min(finish)


def test_a_recomputed_request_pays_for_it_in_its_latency() -> None:
    """The same burst with room for everything: no preemption, and every request ends
    sooner than its preempted self (the recompute and the wait are not free)."""
    tight, _, _ = _run(_burst(6, gap_s=0.05), "on-demand")
    roomy, sim, _ = _run(
        _burst(6, gap_s=0.05), "on-demand", **{"pools.md.kv_capacity_tokens": 10 * MD_CAPACITY}
    )
    assert sim.cluster.decode["md-0"].preemptions == 0
    preempted = [i for i, r in enumerate(tight) if r.preemptions]
    assert preempted
    for i in preempted:
        assert (tight[i].e2e_s or 0.0) > (roomy[i].e2e_s or 0.0)


def test_one_request_larger_than_the_memory_still_finishes() -> None:
    """Alone on its instance a request is never preempted (it could never come back)."""
    trace = [TraceRequest(0, 0.0, 8 * BLOCK, 20_000, tuple(range(8)), BLOCK)]
    preset_capacity = {"pools.md.kv_capacity_tokens": 8 * BLOCK + 1024}
    records, sim, _ = _run(trace, "on-demand", **preset_capacity)
    assert records[0].e2e_s is not None
    assert records[0].tokens_md == 20_000
    assert sim.cluster.decode["md-0"].preemptions == 0


@pytest.mark.parametrize("allocation", ["on-demand", "reserve-output"])
def test_kv_blocks_larger_than_the_traces_are_held_whole(allocation: str) -> None:
    """Engines paging 4,096 tokens: each request holds its last page whole, so fewer run at
    once (reserving the output, 2,048 + 3,000 tokens take two pages: two run, not three; on
    demand, a 2,048-token prompt takes a page: at most four, as the first grow fewer, not
    the six counted token by token), and every page's rest is freed with its request, on P
    and on MD."""
    pages = {"pools.md.kv_block_tokens": 4096, "pools.p.kv_block_tokens": 4096}
    records, sim, running = _run(_burst(6), allocation, **pages)
    _assert_clean(records, sim)
    if allocation == "reserve-output":
        assert max(running) == 2
    else:
        assert 2 <= max(running) <= 4
    for instance in [*sim.cluster.prefill.values(), *sim.cluster.decode.values()]:
        assert instance.cache.reserved == 0, instance.id


def test_outputs_that_fit_in_a_copys_last_page_need_no_more_memory_on_md() -> None:
    """MD pages of 4,096 tokens and memory for three: three copies of 2,048-token prompts
    each hold one page, and their 2,000 tokens out fit in its rest, so all three run at
    once (counted token by token on top of the pages, the third waited some 20 s for the
    first to end); three requests of 3,000 tokens out need a second page each, and MD
    preempts."""
    pages = {"pools.md.kv_block_tokens": 4096, "pools.md.kv_capacity_tokens": 3 * 4096}
    fitting = [dataclasses.replace(r, output_length=2000) for r in _burst(3)]
    records, sim, running = _run(fitting, "on-demand", **pages)
    assert max(running) == 3
    assert all(r.ttft_s is not None and r.ttft_s < 1.0 for r in records)
    assert [r.preemptions for r in records] == [0, 0, 0]
    records, sim, _ = _run(_burst(3), "on-demand", **pages)
    _assert_clean(records, sim)
    assert sum(r.preemptions for r in records) > 0

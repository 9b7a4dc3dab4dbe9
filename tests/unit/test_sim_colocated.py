"""A colocated engine in the replay: chunked prefill inside the decode steps, prefix caching,
a cap on running requests, memory taken as tokens are generated; and its checks."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from fitted_pools import with_fitted

from policies.registry import build_policy, parse_policy
from policies.tiers import Tier
from policies.types import ClusterView, Decision, Matches, Pipeline, RequestView
from replay.metrics import RequestRecord, record_of
from replay.presets import load_preset
from replay.presets.cluster_preset import ClusterPreset
from replay.runner.checks import check_cluster
from replay.sim.colocated_instance import ColocatedInstance
from replay.sim.event_loop import EventLoop
from replay.sim.growing_memory import GrowingMemory
from replay.sim.sim_settings import SimSettings
from replay.sim.simulator import Simulator
from replay.trace.record import TraceRequest
from router.errors import UserError
from router.index.memory_index import MemoryPrefixIndex

BLOCK = 512


def _req(rid: int, at: float, blocks: list[int], output: int) -> TraceRequest:
    return TraceRequest(rid, at, len(blocks) * BLOCK, output, tuple(blocks), BLOCK)


class OnEngine:
    """Every request on one named engine (or the colocated policy when None)."""

    def __init__(self, engine: str | None = "engines-0") -> None:
        self.engine = engine
        self.policy = build_policy(parse_policy("colocated"))
        self.index: MemoryPrefixIndex | None = None

    def decide(self, request: RequestView, cluster: ClusterView) -> Decision:
        if self.engine is not None:
            return Decision(policy="scripted", pipeline=Pipeline.COLOCATED,
                            p_instance=self.engine)  # fmt: skip
        assert self.index is not None
        matches: Matches = {Tier.P: self.index.match(request.chain, tier=Tier.P)}
        return self.policy.decide(request, cluster, matches)


def _preset(**overrides: Any) -> ClusterPreset:
    """One engine, priced by the roofline: these tests check the scheduler's mechanics
    against closed forms of its step costs."""
    pinned: dict[str, Any] = {"pools.engines.instances": 1}
    if not any(".fitted" in key for key in overrides):  # calibrated costs when fitted
        pinned["pools.engines.step_costs.source"] = "roofline"
    return load_preset("colocated-small", {**pinned, **overrides})


def _run(
    trace: list[TraceRequest], preset: ClusterPreset, decider: OnEngine | None = None
) -> tuple[list[RequestRecord], Simulator]:
    loop = EventLoop()
    index = MemoryPrefixIndex(clock=loop.clock)
    decider = decider or OnEngine()
    decider.index = index
    now = SimSettings(kv_event_delay_s=0.0)
    sim = Simulator(preset, decider, index, block_size=BLOCK, settings=now, loop=loop)
    records = [record_of(r) for r in sim.run(trace)]
    return records, sim


def _engine(sim: Simulator, name: str = "engines-0") -> ColocatedInstance:
    engine = sim.cluster.prefill[name]
    assert isinstance(engine, ColocatedInstance)
    return engine


def test_a_long_prompt_is_prefilled_in_chunks_of_the_step_budget() -> None:
    """64 blocks (32,768 tokens) with 8,192-token steps: four chunk passes, each paying
    the pass overhead, then the first token; the rest decoded on the same engine."""
    preset = _preset()
    records, sim = _run([_req(0, 0.0, list(range(64)), output=50)], preset)
    roofline = _engine(sim).step_costs
    passes = sum(roofline.prefill_s([(8192, 8192 * k)]) for k in range(4))
    one_pass = roofline.prefill_s([(32768, 0)])
    record = records[0]
    assert record.pipeline == "colocated"
    assert record.ttft_s == pytest.approx(passes, rel=0.02)
    assert record.ttft_s is not None
    assert record.ttft_s > one_pass  # four overheads, not one
    assert record.tokens_md == 50
    assert record.wan_bytes == 0.0
    assert record.transfer_s is None


def test_a_prefill_slows_the_requests_decoding_beside_it() -> None:
    """What disaggregation removes: a 16K-token prompt arriving mid-decode makes the
    running request's steps as long as a prefill chunk's pass (the longest: the second
    chunk, 8,191 tokens beside the decoding request, attending to the first)."""
    preset = _preset()
    trace = [_req(0, 0.0, [1, 2], output=2000), _req(1, 2.0, list(range(100, 132)), output=5)]
    records, sim = _run(trace, preset)
    roofline = _engine(sim).step_costs
    plain_step = roofline.decode_step_s(1, 2 * BLOCK + 100)
    context = 2 * BLOCK + 2.0 * 200  # about where the decode stands when it arrives
    second_chunk = roofline.mixed_step_s(1, context, 8191, 8191)
    assert records[0].max_gap_s is not None
    assert records[0].max_gap_s > 5 * plain_step
    assert records[0].max_gap_s == pytest.approx(second_chunk, rel=0.02)
    alone, _ = _run(trace[:1], preset)
    assert alone[0].max_gap_s == pytest.approx(roofline.decode_step_s(1, 1024), rel=0.1)


def test_a_shared_prefix_is_served_from_the_engines_cache() -> None:
    preset = _preset()
    shared = list(range(40))
    trace = [_req(0, 0.0, shared, output=5), _req(1, 30.0, [*shared, 900, 901], output=5)]
    records, _ = _run(trace, preset)
    assert records[0].hit_p == 0.0
    assert records[1].hit_p == pytest.approx(40 / 42)
    first, second = records[0].ttft_s, records[1].ttft_s
    assert first is not None
    assert second is not None
    assert second < first / 5


def test_the_cap_on_running_requests_makes_the_rest_wait() -> None:
    preset = _preset(**{"pools.engines.max_batch": 2})
    trace = [_req(i, 0.0, [10 * i], output=300) for i in range(3)]
    records, _ = _run(trace, preset)
    first_two = max(r.e2e_s or 0.0 for r in records[:2])
    assert records[2].ttft_s is not None
    assert records[2].ttft_s >= first_two - 1e-6  # admitted only when a slot freed


@pytest.mark.parametrize("allocation", ["on-demand", "reserve-output"])
def test_memory_pressure_preempts_on_demand_and_nothing_leaks(allocation: str) -> None:
    """Six requests whose prompts fit but whose outputs do not: on demand all six start and
    some are preempted and recomputed; reserving the output, three run at a time."""
    preset = _preset(
        **{"pools.engines.kv_capacity_tokens": 16_384, "memory.allocation": allocation}
    )
    trace = [_req(i, i * 0.01, [100 * i + b for b in range(4)], output=3000) for i in range(6)]
    records, sim = _run(trace, preset)
    engine = _engine(sim)
    assert all(r.e2e_s is not None for r in records)
    assert all(r.tokens_md == 3000 for r in records)
    assert (engine.preemptions > 0) == (allocation == "on-demand")
    assert sum(r.preemptions for r in records) == engine.preemptions
    assert engine.cache.pinned_tokens == pytest.approx(0.0, abs=1e-6)
    assert engine.load.running == engine.load.queued == 0
    assert sim.loop.pending() == 0


def test_the_colocated_policy_spreads_load_and_follows_prefixes() -> None:
    preset = _preset(**{"pools.engines.instances": 2})
    shared = list(range(16))
    trace = [
        _req(0, 0.0, [500, 501], output=400),
        _req(1, 0.1, shared, output=400),  # engines-0 is busy: the other engine
        _req(2, 60.0, [*shared, 900], output=5),  # both idle: back to its prefix
    ]
    records, _ = _run(trace, preset, OnEngine(None))
    assert [r.p_instance for r in records[:2]] == ["engines-0", "engines-1"]
    assert records[2].p_instance == "engines-1"  # by load alone: engines-0, first by name
    assert records[2].predicted_hit_p == pytest.approx(16 / 17)


def test_a_colocated_cluster_takes_only_the_colocated_policy() -> None:
    with pytest.raises(UserError, match="route it with --policy colocated"):
        check_cluster(_preset(), "idc-pd", None)
    with pytest.raises(UserError, match="policy colocated needs a colocated pool"):
        check_cluster(load_preset("idc-pd-small"), "colocated", None)
    check_cluster(_preset(), "colocated", None)


def test_a_colocated_pool_must_be_a_p_pool_alone() -> None:
    with pytest.raises(UserError, match="tier must be p"):
        load_preset("colocated-small", {"pools.engines.tier": "md"})
    with pytest.raises(UserError, match="cannot share the cluster"):
        load_preset("idc-pd-small", {"pools.p.colocated": True})


def test_a_request_preempted_while_prefilling_comes_back_and_finishes() -> None:
    """Memory fills while the last admitted request is still prefilling (64-token steps
    make its prefill long): it is freed, its progress lost, and the engine goes on (a
    stale chunk event once crashed it)."""
    probe = _engine(_run([], _preset())[1])
    grown_by_1s = 3 * 1.0 / probe.step_costs.decode_step_s(3, 3 * BLOCK * 4)
    capacity = 3 * 4 * BLOCK + 12 * BLOCK + int(grown_by_1s) + 150
    preset = _preset(**{"pools.engines.kv_capacity_tokens": capacity, "timing.step_tokens": 64})
    decoders = [_req(i, 0.0, [100 * i + b for b in range(4)], output=3000) for i in range(3)]
    late = _req(3, 1.0, [900 + b for b in range(12)], output=10)
    records, sim = _run([*decoders, late], preset)
    engine = _engine(sim)
    assert records[3].preemptions > 0  # preempted while prefilling (it admitted last)
    assert all(r.e2e_s is not None for r in records)
    assert [r.tokens_md for r in records] == [3000, 3000, 3000, 10]
    assert engine.cache.pinned_tokens == pytest.approx(0.0, abs=1e-6)
    assert sim.loop.pending() == 0


def test_the_requests_prefilled_in_one_step_get_their_first_token_when_it_ends() -> None:
    """Five 2,048-token prompts arriving together, 8,192-token steps: vLLM prefills the
    first four in one step and gives all four their first token when it ends (not one
    after the other as their prefills finish); the fifth comes a step later."""
    preset = _preset()
    trace = [_req(i, 0.0, [100 * i + b for b in range(4)], output=20) for i in range(5)]
    records, sim = _run(trace, preset)
    ttfts = [r.ttft_s for r in records]
    assert all(t is not None for t in ttfts)
    first_four = [t for t in ttfts[:4] if t is not None]
    assert max(first_four) - min(first_four) < 1e-9
    roofline = _engine(sim).step_costs
    assert first_four[0] == pytest.approx(roofline.prefill_s([(8192, 0)]), rel=0.05)
    second_step = roofline.mixed_step_s(4, 4 * 2049, 2048, 0)  # beside the four decoding
    fifth = ttfts[4]
    assert fifth is not None
    assert fifth - first_four[0] == pytest.approx(second_step, rel=0.05)


def _calibrated(frontend_s: float) -> ClusterPreset:
    one_engine = load_preset("colocated-small", {"pools.engines.instances": 1})
    return with_fitted(one_engine, "engines", frontend_s)


def test_a_calibrated_engines_server_takes_requests_one_after_another() -> None:
    """The time a calibrated engine spends on a request outside its passes (its API
    server's, 10 ms here) is paid in turn by requests arriving together, and once by a
    request arriving alone. The same server streams the answers: the first tokens the
    engine produces while it is still taking the burst in come out when it is through (as
    vLLM's first tokens of a burst do, together), not 10 ms apart."""
    prefill = 0.001 + 512e-6  # one 512-token prompt's pass
    trace = [_req(i, 0.0, [10 * i], output=4) for i in range(3)]
    alone = _req(3, 5.0, [77], output=4)
    records, sim = _run([*trace, alone], _calibrated(0.010))
    # prefilled at 10 and 20 ms (+ the pass), held until the server took the third in
    ttfts = [r.ttft_s or 0.0 for r in records[:3]]
    assert ttfts == pytest.approx([0.030, 0.030, 0.030 + prefill], abs=1e-4)
    first = sim.requests[0]
    assert first.prefill_end_s == pytest.approx(0.010 + prefill, abs=1e-4)  # engine's time
    # its other tokens, out of the engine meanwhile, cannot reach the client before it
    assert all(r.e2e_s is not None and r.e2e_s >= r.ttft_s for r in records[:3] if r.ttft_s)
    assert records[3].ttft_s == pytest.approx(0.010 + prefill, abs=1e-3)
    uncalibrated, _ = _run([alone], _calibrated(0.0))
    assert uncalibrated[0].ttft_s == pytest.approx(prefill, abs=1e-3)


def test_a_held_first_token_is_also_the_end_of_a_short_answer() -> None:
    """A one-token answer and a four-token one, prefilled while the server still takes a
    burst in: each ends, for the client, when its held first token reaches it; neither
    ends before it starts."""
    trace = [_req(0, 0.0, [1], output=1), _req(1, 0.0, [2], output=4)]
    trace += [_req(i, 0.0, [10 * i], output=4) for i in range(2, 5)]
    records, _ = _run(trace, _calibrated(0.010))
    one, four = records[0], records[1]
    assert one.ttft_s == pytest.approx(0.050, abs=1e-4)  # the server took five in
    assert one.e2e_s == one.ttft_s
    assert one.tpot_s is None
    assert four.ttft_s == pytest.approx(0.050, abs=1e-4)
    assert four.e2e_s == four.ttft_s  # its other tokens came out of the engine meanwhile
    assert four.tpot_s == 0.0


class _BoundedLoop(EventLoop):
    """Stops a run that schedules more events than a replay of its size could need."""

    __slots__ = ("budget",)

    def __init__(self, budget: int) -> None:
        super().__init__()
        self.budget = budget

    def after(self, delay: float, priority: int, handler: Any, arg: Any = None) -> None:
        self.budget -= 1
        if self.budget < 0:
            raise RuntimeError(f"runaway: an event at {self.now} keeps scheduling itself")
        super().after(delay, priority, handler, arg)


def _run_small_blocks(
    trace: list[TraceRequest], preset: ClusterPreset, budget: int = 100_000
) -> tuple[list[RequestRecord], Simulator]:
    loop = _BoundedLoop(budget)
    index = MemoryPrefixIndex(clock=loop.clock)
    now = SimSettings(kv_event_delay_s=0.0)
    sim = Simulator(preset, OnEngine(), index, block_size=16, settings=now, loop=loop)
    return [record_of(r) for r in sim.run(trace)], sim


@pytest.mark.parametrize("step_tokens", [64, 2048, 8192])
def test_a_trace_timed_in_epoch_seconds_replays_to_its_end(step_tokens: int) -> None:
    """Far from time 0 a step's remainder of a few ulps was timed again at the same
    instant, forever (a trace whose timestamps are Unix seconds hung the replay)."""
    preset = _preset(**{"timing.step_tokens": step_tokens})
    trace = [
        TraceRequest(i, 1.7e9 + 0.01 * i, 512 * (3 + i), 50,
                     tuple(100 * (i + 1) + b for b in range(3 + i)), 512)
        for i in range(6)
    ]  # fmt: skip
    records, sim = _run_small_blocks(trace, preset)
    assert [r.tokens_md for r in records] == [50] * 6
    assert sim.loop.pending() == 0


def test_a_request_whose_last_token_is_out_is_not_preempted() -> None:
    """Memory fills at the instant two requests emit their last tokens: neither is
    preempted (their ends free the memory), so neither emits a token more than asked."""
    blocks = [(1, 10, 11), (3, 3, 9), (3, 10, 50)]  # shared prefix blocks, own blocks, output
    arrivals = [0.0, 0.015625, 0.19421225653923604]
    trace = []
    for i, ((prefix, own, output), at) in enumerate(zip(blocks, arrivals, strict=True)):
        chain = tuple([1000 + b for b in range(prefix)] + [100 * (i + 1) + b for b in range(own)])
        trace.append(TraceRequest(i, at, 16 * len(chain), output, chain, 16))
    capacity = max(r.input_length + r.output_length for r in trace) + 18
    preset = _preset(**{"pools.engines.kv_capacity_tokens": capacity, "timing.step_tokens": 33,
                        "pools.engines.max_batch": 2})  # fmt: skip
    records, sim = _run_small_blocks(trace, preset)
    assert [r.tokens_md for r in records] == [11, 9, 50]
    assert _engine(sim).cache.pinned_tokens == pytest.approx(0.0, abs=1e-6)


def test_requests_still_in_the_engines_server_count_in_its_load() -> None:
    """Four requests arriving together at two calibrated engines (10 ms of server time
    each): the colocated policy sees those it has just sent, so it splits them two and
    two, rather than sending all four to the engine that looked idle."""
    preset = _calibrated(0.010)
    spec = preset.spec
    pool = spec.pools["engines"].model_copy(update={"instances": 2})
    preset = dataclasses.replace(
        preset, spec=spec.model_copy(update={"pools": {**spec.pools, "engines": pool}})
    )
    trace = [_req(i, 0.0, [10 * i, 10 * i + 1], output=4) for i in range(4)]
    records, _ = _run(trace, preset, OnEngine(None))
    engines = sorted(r.p_instance or "" for r in records)
    assert engines == ["engines-0", "engines-0", "engines-1", "engines-1"]


def test_an_engine_with_larger_kv_blocks_hits_whole_blocks_of_a_cached_prefix() -> None:
    """Pages of four trace blocks (2,048 tokens): a second request sharing ten blocks of the
    first's prompt is served eight of them (two whole pages) from the cache."""
    shared = list(range(10))
    trace = [_req(0, 0.0, [*shared, 50], output=5), _req(1, 30.0, [*shared, 60, 61], output=5)]
    exact, _ = _run(trace, _preset())
    paged, _ = _run(trace, _preset(**{"pools.engines.kv_block_tokens": 4 * BLOCK}))
    assert exact[1].hit_p == pytest.approx(10 / 12)
    assert paged[1].hit_p == pytest.approx(8 / 12)


@pytest.mark.parametrize("allocation", ["on-demand", "reserve-output"])
def test_each_request_holds_its_last_kv_block_whole(allocation: str) -> None:
    """Memory for four pages of 4,096 tokens: requests of one 512-token block and a short
    output each hold a whole page, so four run at once and the fifth waits for one to end
    (counted token by token, all five fit). The pages' rest is freed with the requests."""
    capacity = {"pools.engines.kv_capacity_tokens": 16_384, "memory.allocation": allocation}
    trace = [_req(i, 0.0, [100 + i], output=200) for i in range(5)]
    exact, _ = _run(trace, _preset(**capacity))
    paged, sim = _run(trace, _preset(**capacity, **{"pools.engines.kv_block_tokens": 4096}))
    first_end = min(r.e2e_s or 0.0 for r in paged[:4])
    assert max(r.ttft_s or 0.0 for r in exact) < first_end / 5
    assert paged[4].ttft_s is not None
    assert paged[4].ttft_s >= first_end - 1e-6
    engine = _engine(sim)
    assert engine.cache.pinned_tokens == pytest.approx(0.0, abs=1e-6)
    assert engine.cache.reserved == 0


def test_outputs_that_fit_in_their_prompts_last_page_need_no_more_memory() -> None:
    """Pages of 4,096 tokens, memory for two: two requests of one 512-token block each hold
    one page from admission, and their 3,000 tokens out fit in its rest, so neither is
    preempted (counted token by token on top of the admitted pages, they would be)."""
    capacity = {"pools.engines.kv_capacity_tokens": 8192, "pools.engines.kv_block_tokens": 4096}
    trace = [_req(i, i * 0.01, [100 + i], output=3000) for i in range(2)]
    records, sim = _run(trace, _preset(**capacity))
    assert [r.preemptions for r in records] == [0, 0]
    assert all(r.tokens_md == 3000 for r in records)
    assert _engine(sim).cache.pinned_tokens == pytest.approx(0.0, abs=1e-6)


def test_a_request_preempted_for_a_page_waits_until_its_pages_are_free() -> None:
    """Memory for three pages of 4,096 tokens, three requests of one page each whose
    outputs (4,000 tokens) need a second: the first to pass its page's end takes the page
    of the request admitted last, preempted; the second to pass it takes the next one's.
    Neither comes back before a request ends (each needs two pages again, with what it
    generated), so each is preempted once, as vLLM does, not again and again."""
    capacity = {"pools.engines.kv_capacity_tokens": 3 * 4096, "pools.engines.kv_block_tokens": 4096}
    trace = [_req(i, i * 0.01, [100 + i], output=4000) for i in range(3)]
    records, sim = _run(trace, _preset(**capacity))
    assert [r.preemptions for r in records] == [0, 1, 1]
    assert all(r.tokens_md == 4000 for r in records)
    engine = _engine(sim)
    assert engine.preemptions == 2
    assert engine.cache.pinned_tokens == pytest.approx(0.0, abs=1e-6)
    assert engine.load.running == engine.load.queued == 0


def test_pages_fill_at_the_same_moments_with_timestamps_of_the_epoch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unix-time arrivals (1.7e9 s, where the clock's resolution is 0.24 us): the crossing
    that fills the memory still comes, instead of being timed again and again at one
    instant, and the run preempts as the same trace at time 0 does."""
    calls: dict[float, int] = {}
    full = GrowingMemory._full

    def counted(self: GrowingMemory, version: int) -> None:
        now = self._loop.now
        calls[now] = calls.get(now, 0) + 1
        assert calls[now] < 1000, f"the memory's fill timed again and again at {now}"
        full(self, version)

    monkeypatch.setattr(GrowingMemory, "_full", counted)
    capacity = {"pools.engines.kv_capacity_tokens": 3 * 4096, "pools.engines.kv_block_tokens": 4096}
    for start in (0.0, 1.7e9):
        trace = [_req(i, start + i * 0.01, [100 + i], output=4000) for i in range(3)]
        records, _ = _run(trace, _preset(**capacity))
        assert [r.preemptions for r in records] == [0, 1, 1]

"""The servers a request passes through besides the engines' passes: the router's own time
(``timing.router_s``) and a decode engine's server (a calibrated pool's ``frontend_s``)."""

from __future__ import annotations

import dataclasses

import pytest

from policies.types import ClusterView, Decision, Pipeline, RequestView
from replay.metrics import RequestRecord, record_of
from replay.presets import load_preset
from replay.presets.cluster_preset import ClusterPreset
from replay.presets.schema import FittedTiming
from replay.sim.event_loop import EventLoop
from replay.sim.simulator import Simulator
from replay.trace.record import TraceRequest
from router.index.memory_index import MemoryPrefixIndex

BLOCK = 512


def _req(rid: int, at: float, blocks: list[int]) -> TraceRequest:
    return TraceRequest(rid, at, len(blocks) * BLOCK, 8, tuple(blocks), BLOCK)


class PMd:
    """Every request P-MD, and when each was decided."""

    def __init__(self) -> None:
        self.decided_at: list[float] = []

    def decide(self, request: RequestView, cluster: ClusterView) -> Decision:
        self.decided_at.append(cluster.now)
        return Decision(policy="scripted", pipeline=Pipeline.P_MD, p_instance="p-0",
                        md_instance="md-0")  # fmt: skip


def _preset(router_s: float = 0.0, md_frontend_s: float | None = None) -> ClusterPreset:
    preset = load_preset(
        "idc-pd-small",
        {"pools.p.instances": 1, "pools.md.instances": 1, "timing.router_s": router_s},
    )
    if md_frontend_s is None:
        return preset
    fitted = FittedTiming(
        prefill_overhead_s=0.001, prefill_s_per_token=1e-6, prefill_s_per_token_pair=0.0,
        decode_overhead_s=0.002, decode_s_per_request=0.0, decode_s_per_context_token=0.0,
        frontend_s=md_frontend_s,
    )  # fmt: skip
    spec = preset.spec
    md = spec.pools["md"].model_copy(update={"fitted": fitted})
    spec = spec.model_copy(update={"pools": {**spec.pools, "md": md}})
    return dataclasses.replace(preset, spec=spec)


def _run(trace: list[TraceRequest], preset: ClusterPreset) -> tuple[list[RequestRecord], PMd]:
    loop = EventLoop()
    decider = PMd()
    sim = Simulator(preset, decider, MemoryPrefixIndex(clock=loop.clock), block_size=BLOCK,
                    loop=loop)  # fmt: skip
    return [record_of(r) for r in sim.run(trace)], decider


def test_the_routers_own_time_delays_each_request_and_a_burst_waits_in_line() -> None:
    alone = [_req(0, 0.0, [1, 2])]
    free, _ = _run(alone, _preset())
    paid, _ = _run(alone, _preset(router_s=0.05))
    assert free[0].ttft_s is not None
    assert paid[0].ttft_s is not None
    assert paid[0].ttft_s - free[0].ttft_s == pytest.approx(0.05, abs=1e-9)
    burst = [_req(i, 1.0, [10 * i + 1]) for i in range(3)]
    _, decider = _run(burst, _preset(router_s=0.05))
    assert decider.decided_at == pytest.approx([1.05, 1.10, 1.15])
    _, free_decider = _run(burst, _preset())
    assert free_decider.decided_at == pytest.approx([1.0, 1.0, 1.0])


def test_a_decode_engines_server_takes_each_request_the_router_hands_it() -> None:
    alone = [_req(0, 0.0, [1, 2])]
    free, _ = _run(alone, _preset(md_frontend_s=0.0))
    paid, _ = _run(alone, _preset(md_frontend_s=0.02))
    assert free[0].ttft_s is not None
    assert paid[0].ttft_s is not None
    assert paid[0].ttft_s - free[0].ttft_s == pytest.approx(0.02, abs=1e-6)
    # prefills of a few ms land close together; MD's server takes them a second apart
    burst = [_req(i, 0.0, [10 * i + 1]) for i in range(3)]
    records, _ = _run(burst, _preset(md_frontend_s=1.0))
    firsts = sorted(r.ttft_s or 0.0 for r in records)
    assert firsts[1] - firsts[0] == pytest.approx(1.0, abs=0.01)
    assert firsts[2] - firsts[1] == pytest.approx(1.0, abs=0.01)

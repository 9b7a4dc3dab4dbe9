"""The servers a request passes through besides the engines' passes: the router's own time
(``timing.router_s``) and a decode engine's server (a calibrated pool's ``frontend_s``)."""

from __future__ import annotations

import pytest
from fitted_pools import with_fitted

from policies.types import ClusterView, Decision, HandoffMode, Pipeline, RequestView
from replay.metrics import RequestRecord, record_of
from replay.presets import load_preset
from replay.presets.cluster_preset import ClusterPreset
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
    return preset if md_frontend_s is None else with_fitted(preset, "md", md_frontend_s)


def _run(trace: list[TraceRequest], preset: ClusterPreset) -> tuple[list[RequestRecord], PMd]:
    loop = EventLoop()
    decider = PMd()
    sim = Simulator(preset, decider, MemoryPrefixIndex(clock=loop.clock), block_size=BLOCK,
                    loop=loop)  # fmt: skip
    return [record_of(r) for r in sim.run(trace)], decider


def _extra_ttft(trace: list[TraceRequest], base: ClusterPreset, paid: ClusterPreset) -> float:
    """How much later the first request's first token comes with ``paid`` than ``base``."""
    before, after = _run(trace, base)[0][0].ttft_s, _run(trace, paid)[0][0].ttft_s
    assert before is not None
    assert after is not None
    return after - before


def test_the_routers_own_time_delays_each_request_and_a_burst_waits_in_line() -> None:
    alone = [_req(0, 0.0, [1, 2])]
    assert _extra_ttft(alone, _preset(), _preset(router_s=0.05)) == pytest.approx(0.05, abs=1e-9)
    burst = [_req(i, 1.0, [10 * i + 1]) for i in range(3)]
    _, decider = _run(burst, _preset(router_s=0.05))
    assert decider.decided_at == pytest.approx([1.05, 1.10, 1.15])
    _, free_decider = _run(burst, _preset())
    assert free_decider.decided_at == pytest.approx([1.0, 1.0, 1.0])


def test_a_decode_engines_server_takes_each_request_the_router_hands_it() -> None:
    alone = [_req(0, 0.0, [1, 2])]
    extra = _extra_ttft(alone, _preset(md_frontend_s=0.0), _preset(md_frontend_s=0.02))
    assert extra == pytest.approx(0.02, abs=1e-6)
    # prefills of a few ms land close together; MD's server takes them a second apart
    burst = [_req(i, 0.0, [10 * i + 1]) for i in range(3)]
    records, _ = _run(burst, _preset(md_frontend_s=1.0))
    firsts = sorted(r.ttft_s or 0.0 for r in records)
    assert firsts[1] - firsts[0] == pytest.approx(1.0, abs=0.01)
    assert firsts[2] - firsts[1] == pytest.approx(1.0, abs=0.01)


class PRldMd:
    """Every request P-RLD-MD, handed off in one shot."""

    def decide(self, request: RequestView, cluster: ClusterView) -> Decision:
        return Decision(policy="scripted", pipeline=Pipeline.P_RLD_MD, p_instance="p-0",
                        rld_instance="rld-0", md_instance="md-0",
                        handoff=HandoffMode.ONE_SHOT)  # fmt: skip


def test_a_copy_dropped_while_its_server_holds_it_leaves_no_load_behind() -> None:
    """RLD's server takes a second a request; MD's copy lands across the line first, so
    the request goes straight to MD and RLD's copy is dropped while RLD's server still
    holds it. The request finishes on MD, and RLD shows no request waiting after."""
    preset = load_preset("pdd-small", {"pools.p.instances": 1, "pools.rld.instances": 1,
                                       "pools.md.instances": 1})  # fmt: skip
    preset = with_fitted(preset, "rld", 1.0)
    loop = EventLoop()
    sim = Simulator(preset, PRldMd(), MemoryPrefixIndex(clock=loop.clock), block_size=BLOCK,
                    loop=loop)  # fmt: skip
    records = [record_of(r) for r in sim.run([_req(0, 0.0, [1, 2])])]
    assert records[0].finished_on == "md-0"
    assert records[0].ttft_s is not None
    assert records[0].ttft_s < 1.0  # it did not wait for RLD's server
    rld = sim.cluster.decode["rld-0"].load
    assert (rld.queued, rld.running) == (0, 0)

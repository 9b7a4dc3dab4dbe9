"""Utilization as busy time: the servers' busy clocks, and a replay's figures on cases
computed by hand (one request on one instance: its busy time is its service time)."""

from __future__ import annotations

import pytest

from replay.runner.config import ReplayConfig
from replay.runner.run import run_replay
from replay.sim.busy_time import BusyTime
from replay.sim.decode_batch import DecodeBatch
from replay.sim.event_loop import EventLoop
from replay.sim.events import Priority
from replay.sim.link import Link
from replay.sim.prefill_queue import PrefillQueue
from replay.trace.record import TraceRequest

ONE = TraceRequest(0, 1.0, 3000, 200, tuple(range(6)), 512)
"""One request: 3,000 tokens in (6 blocks), 200 out, arriving 1 s into the trace."""


def test_a_busy_clock_counts_closed_and_open_intervals() -> None:
    clock = BusyTime()
    clock.set(True, 1.0)
    clock.set(True, 1.5)  # still busy: the interval goes on from 1.0
    clock.set(False, 3.0)
    clock.set(False, 4.0)
    clock.set(True, 6.0)
    assert clock.busy_s(7.5) == pytest.approx(2.0 + 1.5)
    assert clock.busy


def test_a_prefill_server_is_busy_while_its_batches_run() -> None:
    loop = EventLoop()
    queue: PrefillQueue[str] = PrefillQueue(loop, lambda batch: 2.0, lambda job: None)
    loop.at(0.0, Priority.ARRIVAL, lambda _: queue.submit("a"))
    loop.at(1.0, Priority.ARRIVAL, lambda _: queue.submit("b"))  # waits: runs 2.0-4.0
    loop.at(10.0, Priority.ARRIVAL, lambda _: queue.submit("c"))  # idle from 4 to 10
    loop.run()
    assert loop.now == pytest.approx(12.0)
    assert queue.busy_time.busy_s(loop.now) == pytest.approx(6.0)


def _ten_ms_per_request(batch: int, context_tokens: float) -> float:
    return 0.01 * batch


def test_a_decode_batch_is_busy_while_it_has_members_not_per_member() -> None:
    loop = EventLoop()
    batch = DecodeBatch(loop, _ten_ms_per_request, lambda key: None)
    loop.at(0.0, Priority.ARRIVAL, lambda _: batch.join(1, 100, 0))
    loop.at(0.5, Priority.ARRIVAL, lambda _: batch.join(2, 10, 0))
    loop.at(5.0, Priority.ARRIVAL, lambda _: batch.join(3, 50, 0))
    loop.run()
    # 1 and 2 overlap from 0.5 to 0.7 and 1 ends at 1.1 (see the fluid decode test); 3
    # decodes 50 tokens alone at 100 tok/s from 5.0: busy 1.1 + 0.5, not the members' sum
    assert batch.busy_time.busy_s(loop.now) == pytest.approx(1.6)


def test_a_line_is_busy_while_it_sends_not_while_the_last_byte_flies() -> None:
    loop = EventLoop()
    link = Link(loop, "wan", 1e9, rtt_s=0.2)
    link.start(1e9, lambda t: None)
    loop.run()
    assert loop.now == pytest.approx(1.1)  # sent by 1.0, arrived RTT/2 later
    assert link.busy_time.busy_s(loop.now) == pytest.approx(1.0)


def _busy_s(summary_instances: dict[str, float], simulated_s: float) -> dict[str, float]:
    return {key: share * simulated_s for key, share in summary_instances.items()}


def test_one_request_keeps_p_busy_for_its_prefill_and_md_for_its_decode() -> None:
    result = run_replay(ReplayConfig(trace="<memory>", preset="idc-pd-small"), requests=[ONE])
    s, record = result.summary, result.records[0]
    assert record.e2e_s is not None
    assert record.ttft_s is not None
    assert record.tpot_s is not None
    assert s.simulated_s == pytest.approx(record.e2e_s)
    busy = _busy_s(s.instance_utilization, s.simulated_s)
    p, md = record.p_instance, record.md_instance
    assert md is not None
    assert busy[p] == pytest.approx(record.prefill_s, rel=1e-4)
    # MD decodes from the first token to the last: 199 steps of TPOT
    assert busy[md] == pytest.approx(record.e2e_s - record.ttft_s, rel=1e-4)
    assert busy[md] == pytest.approx(199 * record.tpot_s, rel=1e-3)
    assert sum(busy.values()) == pytest.approx(busy[p] + busy[md])  # the rest stay idle
    # a tier's utilization is its instances' busy time over theirs (3 P instances)
    assert s.utilization["p"] == pytest.approx(record.prefill_s / (3 * s.simulated_s), rel=1e-3)
    assert s.wan_busy is None  # one datacenter: no line


def test_the_timeline_holds_each_second_busy_share_not_a_sample() -> None:
    result = run_replay(ReplayConfig(trace="<memory>", preset="idc-pd-small"), requests=[ONE])
    s, record = result.summary, result.records[0]
    assert record.e2e_s is not None
    assert record.ttft_s is not None
    timeline = s.timeline
    assert timeline is not None
    assert timeline.window_s == 1.0
    # a sample a second from the arrival while anything is left to run, then one more
    assert timeline.t_s == [0.0, 1.0, 2.0, 3.0, 4.0]
    # P prefills within the first second; MD decodes from the first token to the end
    # (3.26 s after the arrival), one instance of three
    start = record.prefill_queue_s
    assert timeline.utilization["p"] == pytest.approx(
        [record.prefill_s / 3, 0.0, 0.0, 0.0, 0.0], rel=1e-3, abs=1e-6
    )
    assert start + record.prefill_s < record.ttft_s < 1.0
    expected_md = [(1.0 - record.ttft_s) / 3, 1 / 3, 1 / 3, (record.e2e_s - 3.0) / 3, 0.0]
    assert timeline.utilization["md"] == pytest.approx(expected_md, rel=1e-3)


def test_a_line_transfer_and_a_colocated_engine_are_busy_for_their_service() -> None:
    over = {"pools.p.instances": 1, "pools.rld.instances": 1, "pools.md.instances": 1}
    pdd = run_replay(
        ReplayConfig(trace="<memory>", preset="pdd-small", overrides=over), requests=[ONE]
    )
    record, s = pdd.records[0], pdd.summary
    assert record.transfer_s is not None
    assert s.wan_busy is not None
    # the transfer's time minus the last byte's flight (RTT/2, RTT 30 ms)
    assert s.wan_busy * s.simulated_s == pytest.approx(record.transfer_s - 0.015, rel=1e-3)
    colocated = run_replay(ReplayConfig(trace="<memory>", preset="colocated-small"), requests=[ONE])
    record, s = colocated.records[0], colocated.summary
    assert record.e2e_s is not None
    busy = _busy_s(s.instance_utilization, s.simulated_s)
    # admitted once its server has taken it, busy to its last token
    assert busy[record.p_instance] == pytest.approx(record.e2e_s - record.prefill_queue_s, rel=1e-4)

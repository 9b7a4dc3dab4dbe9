"""Admission control in `pdd-adaptive`: refusing what would miss the SLA, not queueing it."""

from __future__ import annotations

import io
import json

import pytest
from policy_views import BLOCK, GBPS20, KV, cluster

from policies.admission import Bottleneck, Overloaded
from policies.decode_wait import slot_wait_s
from policies.pdd_adaptive import rld_load
from policies.registry import build_policy, parse_policy
from policies.tiers import Tier
from policies.types import (
    ClusterView,
    Decision,
    InstanceLoad,
    LinkState,
    Pipeline,
    RequestView,
)
from router.index.base import IndexedInstance
from router.index.memory_index import MemoryPrefixIndex
from router.scheduler import Scheduler
from router.service.wan_ledger import WanLedger


def request(blocks: int = 8, max_tokens: int | None = 2000) -> RequestView:
    return RequestView(tuple(range(blocks)), BLOCK, blocks * BLOCK, max_tokens)


def decide(view: ClusterView, req: RequestView | None = None, **params: object) -> Decision:
    policy = build_policy(parse_policy("pdd-adaptive", params))
    return policy.decide(req or request(), view, {})


def test_an_idle_cluster_admits_and_decides_as_without_admission() -> None:
    view = cluster()
    on, off = decide(view), decide(view, admit_ttft_s=None)
    assert on == off
    assert on.pipeline is Pipeline.P_MD


def test_a_long_prefill_queue_is_refused_with_the_time_it_needs_to_drain() -> None:
    # 200,000 queued tokens at 20,000 tokens/s: 10 s before this prefill even starts
    view = cluster(p_queue_tokens=200_000)
    with pytest.raises(Overloaded) as caught:
        decide(view)
    refused = caught.value
    assert refused.bottleneck is Bottleneck.PREFILL
    # without admission control it is queued as before, its first token 10.4 s away
    queued = decide(view, admit_ttft_s=None)
    assert queued.predicted_ttft_s > 10.0 + 4096 / 20_000
    # retry once the queue has drained by the excess over the 8 s allowed
    assert refused.retry_after_s == pytest.approx(queued.predicted_ttft_s - 8.0)
    assert refused.retry_after_header == "3"
    assert "prefill" in refused.reason
    assert refused.alone_s is None  # the queue is the cause: retrying later helps
    # a looser limit admits it
    assert decide(view, admit_ttft_s=12.0) == queued


def test_a_prompt_too_long_for_the_limit_on_an_idle_cluster_says_so() -> None:
    """Retrying cannot help a request whose own prefill misses the limit: the refusal
    carries its first-token time alone (the service answers 400, not 429)."""
    req = request(blocks=1_000)  # 512,000 tokens at 20,000 tokens/s: 25.6 s of prefill
    with pytest.raises(Overloaded) as caught:
        decide(cluster(), req)
    assert caught.value.alone_s == pytest.approx(25.6 + 0.03)  # and one decode step
    alone = caught.value.alone_s
    with pytest.raises(Overloaded) as queued:  # the same with a queue ahead: still its own
        decide(cluster(p_queue_tokens=200_000), req)
    assert queued.value.alone_s == pytest.approx(alone)


def test_its_own_copy_over_the_line_counts_when_no_rld_could_ever_hold_it() -> None:
    req = request()  # 4,096 tokens: 0.205 s of prefill, 287 MB of KV, 0.115 s on the line
    small_rld = cluster()
    small_rld.pool(Tier.RLD)[0].kv_capacity_tokens = 4_000  # under the prompt alone
    with pytest.raises(Overloaded) as caught:
        decide(small_rld, req, admit_ttft_s=0.3)
    assert caught.value.alone_s == pytest.approx(4096 / 20_000 + 0.03 + 4096 * KV / GBPS20)
    # an RLD that could hold it would finish it in the datacenter within the limit: a
    # refusal then is the load's doing, and a retry may be served
    with pytest.raises(Overloaded) as caught:
        decide(cluster(), req, admit_ttft_s=0.3)
    assert caught.value.alone_s is None


def test_a_full_line_sends_requests_to_rld_while_it_has_room_then_refuses() -> None:
    # 12.5 GB ahead on 20 Gbps: 5 s of backlog, over the 4 s allowed
    backed_up = cluster(backlog=12.5e9, wan_active=10)
    d = decide(backed_up)
    assert d.pipeline is Pipeline.P_RLD
    assert "RLD finishes it" in d.reason
    assert d.predicted_wan_bytes == 0.0
    # RLD saturated: the request takes the line, sharing it with the ten copies ahead
    full = cluster(backlog=12.5e9, wan_active=10, rld_running=250)
    assert decide(full).pipeline is Pipeline.P_MD
    # ... unless its copy, on that share, would miss the admission limit
    with pytest.raises(Overloaded) as caught:
        decide(full, request(64))
    assert caught.value.bottleneck is Bottleneck.WAN
    # a larger backlog allowance keeps it on the line
    assert decide(backed_up, max_wan_backlog_s=10.0).pipeline is not Pipeline.P_RLD


def test_a_full_rld_with_a_slow_copy_is_refused_instead_of_queued() -> None:
    req = request(48)  # 1.72 GB: about 7 s on a tenth of the line
    view = cluster(wan_active=9, rld_running=250)
    assert "queued on RLD" in decide(view, req, admit_ttft_s=None).reason
    with pytest.raises(Overloaded) as caught:
        decide(view, req)
    assert caught.value.bottleneck in (Bottleneck.RLD, Bottleneck.WAN)
    assert caught.value.retry_after_s > 0


def test_requests_on_their_way_to_rld_count_in_its_load() -> None:
    view = cluster(rld_pending_tokens=1_000_000)
    assert rld_load(view.instances[Tier.RLD][0]) == pytest.approx(0.5)
    rld = view.instances[Tier.RLD][0]
    assert rld.kv_uncommitted_tokens == 1_000_000
    assert rld.kv_free_tokens == 2_000_000


def test_the_scheduler_logs_a_refusal_and_passes_it_on() -> None:
    index = MemoryPrefixIndex()
    for iid, tier, dc in (("p0", Tier.P, "A"), ("rld0", Tier.RLD, "A"), ("md0", Tier.MD, "B")):
        index.register(IndexedInstance(iid, tier, dc, 10_000))
    log = io.StringIO()
    policy = build_policy(parse_policy("pdd-adaptive"))
    scheduler = Scheduler(index, policy, decision_log=log)
    with pytest.raises(Overloaded):
        scheduler.decide(request(), cluster(p_queue_tokens=400_000))
    assert scheduler.rejections == 1
    assert scheduler.decisions == 0
    line = json.loads(log.getvalue())
    assert line["kind"] == "rejected"
    assert line["bottleneck"] == "prefill"
    assert line["retry_after_s"] > 10


def test_the_wan_ledger_drains_committed_copies_at_the_line_rate() -> None:
    link = LinkState(bandwidth_bps=1e9, rtt_s=0.03)
    ledger = WanLedger(link)
    ledger.commit(2e9, now=100.0)  # 2 s of line
    ledger.commit(1e9, now=100.0)  # 1 s more, behind it
    assert (link.backlog_bytes, link.active_transfers) == (3e9, 2)
    ledger.sync(101.5)
    assert link.backlog_bytes == pytest.approx(1.5e9)
    assert link.active_transfers == 2
    ledger.sync(102.5)  # the first copy drained at 102 s
    assert link.backlog_bytes == pytest.approx(0.5e9)
    assert link.active_transfers == 1
    ledger.sync(110.0)
    assert (link.backlog_bytes, link.active_transfers) == (0.0, 0)
    ledger.commit(1e9, now=120.0)  # an idle line starts from empty, not from a debt
    assert link.backlog_bytes == pytest.approx(1e9)
    ledger.sync(99.0)  # a clock that steps back changes nothing
    assert link.backlog_bytes == pytest.approx(1e9)


def test_a_full_decode_instance_makes_a_request_wait_for_a_slot() -> None:
    md = InstanceLoad("md0", Tier.MD, "B", kv_capacity_tokens=2_000_000, running=200)
    assert slot_wait_s(md, life_s=15.36, arrive_in_s=0.5) == 0.0  # slots free
    md.queued = 3  # copies landing: still room for them and this one
    assert slot_wait_s(md, 15.36, 0.5) == 0.0
    md.running, md.queued = 0, 1  # an idle instance with one copy on its way
    assert slot_wait_s(md, 15.36, 0.0) == 0.0
    md.running, md.queued = 256, 100  # full, 100 waiting: 101 ahead, a slot per 0.06 s
    assert slot_wait_s(md, 15.36, 0.5) == pytest.approx(101 * 15.36 / 256 - 0.5)
    md.queued, md.pending = 0, 10  # full once the ten on their way land: it is the 11th
    assert slot_wait_s(md, 15.36, 0.0) == pytest.approx(11 * 15.36 / 256)
    assert slot_wait_s(md, 15.36, 5.0) == 0.0  # slots free by the time it lands


def test_a_request_that_would_wait_for_a_slot_on_a_full_md_is_refused() -> None:
    """Past MD's capacity the wait for a decode slot grows without bound; admission control
    refuses what would miss its limit there, as it does for the prefill queue."""
    view = cluster(rld_running=250)  # RLD saturated too: nowhere else to go
    for md in view.pool(Tier.MD):
        md.running, md.queued = 256, 300  # each full, 300 waiting
    admitted = decide(view, admit_ttft_s=None)
    assert admitted.pipeline is Pipeline.P_MD
    # 301 ahead, a slot freed every 512 x 0.03 / 256 s: 18.06 s less the prefill and copy
    idle = decide(cluster(), admit_ttft_s=None)
    wait = 301 * 512 * 0.03 / 256 - (idle.predicted_ttft_s - 0.03)
    assert admitted.predicted_ttft_s == pytest.approx(idle.predicted_ttft_s + wait)
    with pytest.raises(Overloaded) as caught:
        decide(view)
    assert caught.value.bottleneck is Bottleneck.MD
    assert caught.value.retry_after_s == pytest.approx(admitted.predicted_ttft_s - 8.0)
    assert caught.value.alone_s is None  # the queue is the cause: a retry may be served
    for md in view.pool(Tier.MD):
        md.queued = 20  # a short line: served within the limit
    assert decide(view).pipeline is Pipeline.P_MD


def test_a_request_that_would_wait_on_a_full_md_is_finished_on_rld_while_it_has_room() -> None:
    view = cluster()
    for md in view.pool(Tier.MD):
        md.running, md.queued = 256, 300
    d = decide(view)
    assert d.pipeline is Pipeline.P_RLD
    assert d.reason.startswith("MD full: 17.7s for a slot there, first token 18.09s")
    assert d.predicted_ttft_s < 8.0

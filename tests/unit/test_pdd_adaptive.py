"""`pdd-adaptive`: WAN budget from the TTFT objective, backlog, RLD load, odd traffic."""

from __future__ import annotations

import copy

import pytest
from policy_views import BLOCK, GBPS20, KV, cluster

from policies.config import PddAdaptiveParams
from policies.pdd_adaptive import PddAdaptivePolicy, rld_load, wan_time_s
from policies.registry import build_policy, parse_policy
from policies.tiers import Tier
from policies.types import (
    ClusterView,
    Decision,
    HandoffMode,
    LinkState,
    Matches,
    Pipeline,
    RequestView,
    SessionHistory,
)


def request(
    blocks: int = 48, max_tokens: int | None = None, history: SessionHistory | None = None
) -> RequestView:
    return RequestView(tuple(range(blocks)), BLOCK, blocks * BLOCK, max_tokens, history=history)


def decide(req: RequestView, view: ClusterView, matches: Matches, **kw: object) -> Decision:
    return build_policy(parse_policy("pdd-adaptive", kw)).decide(req, view, matches)


def test_registered_with_typed_parameters() -> None:
    params = parse_policy("pdd-adaptive", {"ttft_objective_s": 3, "handoff_mode": "one-shot"})
    assert isinstance(params, PddAdaptiveParams)
    assert params.ttft_objective_s == 3.0
    assert isinstance(build_policy(params), PddAdaptivePolicy)


def test_wan_time_is_delta_over_the_current_share_plus_rtt() -> None:
    link = LinkState(GBPS20, 0.03, active_transfers=3)
    assert wan_time_s(link, 1e9) == pytest.approx(1e9 / (GBPS20 / 4) + 0.03)
    assert wan_time_s(link, 0) == 0.0


def test_a_fast_prefill_leaves_more_of_the_ttft_objective_to_the_wan() -> None:
    req = request(48)  # 24,576 tokens: 1.72 GB, 1.41 s on half of 20 Gbps
    view = cluster(wan_active=1)
    slow = decide(req, view, {})  # cold prefill 1.23 s: budget floored at 1 s
    assert slow.pipeline is Pipeline.P_RLD_MD
    fast = decide(req, view, {Tier.P: {"p0": 44}})  # 0.1 s of prefill: budget 1.87 s
    assert fast.pipeline is Pipeline.P_MD
    assert fast.predicted_wan_s == pytest.approx(24_576 * KV / (GBPS20 / 2) + 0.03)
    assert fast.predicted_ttft_s == pytest.approx(2_048 / 20_000 + fast.predicted_wan_s + 0.03)


def test_borderline_requests_move_to_rld_when_the_wan_backs_up() -> None:
    req = request(48)  # 0.72 s alone: within the 1 s budget, over half of it
    assert decide(req, cluster(), {}).pipeline is Pipeline.P_MD
    backed_up = cluster(backlog=5e9)  # two seconds of backlog
    d = decide(req, backed_up, {})
    assert d.pipeline is Pipeline.P_RLD_MD
    assert "borderline" in d.reason
    # only while RLD has room to spare
    busy = cluster(backlog=5e9, rld_running=150)
    assert decide(req, busy, {}).pipeline is Pipeline.P_MD


def test_a_saturated_rld_sends_tolerable_requests_to_p_md_and_queues_the_rest() -> None:
    req = request(48)
    off = {"admit_ttft_s": None}  # admission control off: nothing is refused
    d = decide(req, cluster(wan_active=1, rld_running=250), {}, **off)
    assert d.pipeline is Pipeline.P_MD
    assert "RLD load" in d.reason
    # RLD full of KV is saturated too, whatever its batch
    full = cluster(wan_active=1, rld_kv_used=1_990_000)
    assert decide(req, full, {}, **off).pipeline is Pipeline.P_MD
    # a WAN copy of ~7 s is too long for P-MD: the request queues on RLD
    slow = decide(req, cluster(wan_active=9, rld_running=250), {}, **off)
    assert slow.pipeline is Pipeline.P_RLD_MD
    assert "queued on RLD" in slow.reason


def test_handoff_is_catch_up_with_room_and_one_shot_when_busy() -> None:
    req = request(48)
    calm = decide(req, cluster(wan_active=1, rld_running=50), {})
    assert calm.handoff is HandoffMode.CATCH_UP
    assert calm.chunk_tokens == 64
    busy = decide(req, cluster(wan_active=1, rld_running=150), {})
    assert busy.handoff is HandoffMode.ONE_SHOT
    assert busy.chunk_tokens is None
    forced = decide(req, cluster(wan_active=1, rld_running=150), {}, handoff_mode="catch-up")
    assert forced.handoff is HandoffMode.CATCH_UP
    assert rld_load(cluster(rld_kv_used=1_500_000).instances[Tier.RLD][0]) == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("max_tokens", "history", "unhinted", "odd"),
    [
        (200, None, False, True),  # max_tokens says short
        (2000, None, True, False),  # max_tokens says long, whatever the default
        (None, SessionHistory(turns=3, outputs_known=3, mean_output=120.0), False, True),
        (None, SessionHistory(turns=3, outputs_known=3, mean_output=900.0), True, False),
        (None, None, True, True),  # nothing known: the parameter decides
        (None, None, False, False),
    ],
)
def test_odd_traffic_is_judged_from_what_is_known_at_arrival(
    max_tokens: int | None, history: SessionHistory | None, unhinted: bool, odd: bool
) -> None:
    policy = PddAdaptivePolicy(PddAdaptiveParams(odd_unhinted=unhinted))
    req = request(80, max_tokens, history)  # 40,960 tokens
    assert policy.is_odd(req) is odd
    assert not policy.is_odd(request(16, max_tokens, history))  # short prompts never are
    d = decide(req, cluster(), {}, odd_unhinted=unhinted)
    assert (d.pipeline is Pipeline.P_RLD) is odd
    if odd:
        assert d.md_instance is None
        assert d.predicted_wan_bytes == 0


def test_odd_traffic_with_a_cheap_wan_copy_still_goes_to_md() -> None:
    d = decide(request(80, max_tokens=100), cluster(), {Tier.MD: {"md1": 79}})
    assert d.pipeline is Pipeline.P_MD
    assert d.md_instance == "md1"


def test_expected_output_prefers_max_tokens_then_history() -> None:
    policy = PddAdaptivePolicy(PddAdaptiveParams(expected_output=700))
    assert policy.expected_output(request(max_tokens=42)) == 42
    hist = SessionHistory(turns=2, outputs_known=2, mean_output=99.6)
    assert policy.expected_output(request(history=hist)) == 100
    assert policy.expected_output(request()) == 700


def test_deciding_is_pure() -> None:
    view = cluster(wan_active=2, backlog=3e9, rld_running=40)
    before = copy.deepcopy(view)
    matches = {Tier.MD: {"md0": 10, "md1": 30}, Tier.P: {"p1": 20}}
    first = decide(request(48), view, matches)
    assert decide(request(48), view, matches) == first
    assert view == before

"""Policies: which pipeline, instances and handoff each baseline and PDD choose."""

from __future__ import annotations

import pytest

from policies.config import PddParams
from policies.registry import UnknownPolicyError, build_policy, parse_policy, policy_names
from policies.tiers import Tier
from policies.types import (
    ClusterView,
    Decision,
    HandoffMode,
    InstanceLoad,
    LinkState,
    Matches,
    Pipeline,
    RequestView,
)

KV = 70_000.0  # bytes per token
BLOCK = 512


def cluster(*, rld_running: int = 0, wan_active: int = 0) -> ClusterView:
    """Two P and one RLD in A, two MD in B; ``wan_active`` transfers of 1 GB each ahead."""

    def inst(iid: str, tier: Tier, dc: str, running: int = 0) -> InstanceLoad:
        return InstanceLoad(iid, tier, dc, kv_capacity_tokens=2_000_000, running=running)

    return ClusterView(
        instances={
            Tier.P: [inst("p0", Tier.P, "A"), inst("p1", Tier.P, "A")],
            Tier.RLD: [inst("rld0", Tier.RLD, "A", rld_running)],
            Tier.MD: [inst("md0", Tier.MD, "B"), inst("md1", Tier.MD, "B")],
        },
        wan=LinkState(
            bandwidth_bps=20e9 / 8,
            rtt_s=0.03,
            active_transfers=wan_active,
            backlog_bytes=wan_active * 1e9,
        ),
        rdma=LinkState(bandwidth_bps=400e9 / 8, rtt_s=1e-5),
        kv_bytes_per_token=KV,
        prefill_tokens_per_s=20_000.0,
        decode_step_s=0.03,
    )


def request(blocks: int = 64, max_tokens: int | None = None) -> RequestView:
    return RequestView(
        chain=tuple(range(blocks)),
        block_size=BLOCK,
        input_length=blocks * BLOCK,
        max_tokens=max_tokens,
    )


def decide(
    name: str, req: RequestView, view: ClusterView, matches: Matches, **kw: object
) -> Decision:
    return build_policy(parse_policy(name, kw)).decide(req, view, matches)


def test_pdd_sends_a_high_hit_request_p_md_with_only_the_delta() -> None:
    req = request(64)
    d = decide("pdd", req, cluster(), {Tier.MD: {"md0": 2, "md1": 62}})
    assert d.pipeline is Pipeline.P_MD
    assert d.md_instance == "md1"  # the instance holding the prefix
    assert d.predicted_wan_bytes == pytest.approx(2 * BLOCK * KV)
    assert d.predicted_hit[Tier.MD] == pytest.approx(62 / 64)
    assert d.handoff is None


def test_pdd_masks_a_slow_low_hit_transfer_with_rld() -> None:
    req = request(64)  # 32k tokens * 70 KB = 2.3 GB: about 0.9 s alone on 20 Gbps
    d = decide("pdd", req, cluster(wan_active=3), {Tier.MD: {"md0": 0, "md1": 0}})
    assert d.pipeline is Pipeline.P_RLD_MD
    assert d.rld_instance == "rld0"
    assert d.predicted_wan_s > 1.0
    assert d.handoff is HandoffMode.CATCH_UP
    assert d.chunk_tokens == 64
    # TTFT is the local one: prefill plus RDMA, not the WAN
    assert d.predicted_ttft_s < d.predicted_wan_s


def test_pdd_hands_off_one_shot_when_rld_is_busy() -> None:
    d = decide("pdd", request(64), cluster(rld_running=150, wan_active=3), {})
    assert d.pipeline is Pipeline.P_RLD_MD
    assert d.handoff is HandoffMode.ONE_SHOT
    assert d.chunk_tokens is None


def test_pdd_falls_back_to_p_md_when_rld_is_saturated() -> None:
    d = decide("pdd", request(64), cluster(rld_running=250, wan_active=3), {})
    assert d.pipeline is Pipeline.P_MD
    assert "saturated" in d.reason


def test_pdd_finishes_odd_traffic_on_rld() -> None:
    d = decide("pdd", request(80, max_tokens=200), cluster(), {})
    assert d.pipeline is Pipeline.P_RLD
    assert d.md_instance is None
    assert d.predicted_wan_bytes == 0
    # a short prompt with a small max_tokens is not odd traffic
    short = decide("pdd", request(8, max_tokens=200), cluster(), {})
    assert short.pipeline is Pipeline.P_MD


def test_wan_budget_is_the_boundary() -> None:
    req = request(64)
    matches = {Tier.MD: {"md0": 32}}  # 16k tokens missing: ~0.46 s on an idle 20 Gbps line
    assert decide("pdd", req, cluster(), matches, wan_budget_s=0.5).pipeline is Pipeline.P_MD
    assert decide("pdd", req, cluster(), matches, wan_budget_s=0.4).pipeline is Pipeline.P_RLD_MD


def test_xdc_pd_ships_the_full_prompt_even_when_md_holds_it() -> None:
    req = request(64)
    d = decide("xdc-pd", req, cluster(), {Tier.MD: {"md0": 64, "md1": 64}})
    assert d.pipeline is Pipeline.P_MD
    assert not d.reuse_md_cache
    assert d.predicted_wan_bytes == pytest.approx(64 * BLOCK * KV)


def test_idc_pd_moves_kv_over_rdma_only() -> None:
    view = cluster()
    for md in view.instances[Tier.MD]:
        md.datacenter = "A"
    d = decide("idc-pd", request(64), view, {})
    assert d.pipeline is Pipeline.P_MD
    assert d.predicted_wan_bytes == 0
    assert d.predicted_ttft_s < 2.0  # 32k-token prefill at 20k tok/s plus RDMA


def test_prefill_choice_prefers_cache_then_load() -> None:
    view = cluster()
    d = decide("pdd", request(64), view, {Tier.P: {"p1": 60}})
    assert d.p_instance == "p1"
    assert d.predicted_hit[Tier.P] == pytest.approx(60 / 64)
    # p1 holds the prefix but has a long queue: p0 finishes first
    view.instances[Tier.P][1].queued_prefill_tokens = 200_000
    d = decide("pdd", request(64), view, {Tier.P: {"p1": 60}})
    assert d.p_instance == "p0"


def test_decode_choice_avoids_a_busy_instance_holding_the_prefix() -> None:
    view = cluster()
    view.instances[Tier.MD][1].running = 256  # md1 full
    d = decide("pdd", request(64), view, {Tier.MD: {"md1": 63}}, load_weight_s=5.0)
    assert d.md_instance == "md0"


def test_registry_lists_valid_names_and_refuses_bad_parameters() -> None:
    assert policy_names() == ["colocated", "idc-pd", "pdd", "pdd-adaptive", "xdc-pd", "xdc-pd-drc"]
    valid = "valid policies: colocated, idc-pd, pdd, pdd-adaptive, xdc-pd, xdc-pd-drc"
    with pytest.raises(UnknownPolicyError, match=valid):
        parse_policy("round-robin")
    with pytest.raises(UnknownPolicyError, match="wan_budget_s"):
        parse_policy("pdd", {"wan_budget_s": -1})
    with pytest.raises(UnknownPolicyError, match="nonsense"):
        parse_policy("pdd", {"nonsense": 1})
    listing = "parameters of pdd: catch_up_below, chunk_tokens, load_weight_s, "
    with pytest.raises(UnknownPolicyError, match=f"wan_budgt_s: unknown parameter; {listing}"):
        parse_policy("pdd", {"wan_budgt_s": 1})
    cfg = parse_policy("pdd", {"chunk_tokens": 32})
    assert isinstance(cfg, PddParams)
    assert cfg.chunk_tokens == 32


def test_link_prediction_follows_processor_sharing() -> None:
    link = LinkState(bandwidth_bps=1e9, rtt_s=0.02)
    assert link.transfer_s(1e9) == pytest.approx(0.01 + 1.0)
    # two transfers ahead, 0.25 GB left each: ours shares until they finish
    link.active_transfers, link.backlog_bytes = 2, 0.5e9
    assert link.transfer_s(1e9) == pytest.approx(0.01 + 1.5)
    # two huge transfers ahead: we share equally the whole way, three times slower
    link.backlog_bytes = 100e9
    assert link.transfer_s(1e9) == pytest.approx(0.01 + 3.0)
    assert link.transfer_s(0) == 0.0


def test_a_hit_counts_as_the_engine_serves_it() -> None:
    """Matched router blocks become the tokens the engine would serve from cache: whole
    blocks of its own size, never the prompt's last token (when it reported its size)."""
    from policies.estimates import hit_tokens
    from policies.tiers import Tier
    from policies.types import InstanceLoad, RequestView

    request = RequestView(tuple(range(20)), 16, 320, 8)  # 20 blocks of 16 tokens
    plain = InstanceLoad("md0", Tier.MD, "B", kv_capacity_tokens=10**6)
    vllm = InstanceLoad("md1", Tier.MD, "B", kv_capacity_tokens=10**6, cache_block_tokens=128)
    sim = InstanceLoad("md2", Tier.MD, "B", kv_capacity_tokens=10**6, cache_block_tokens=16)
    assert hit_tokens(request, 20) == 320  # no engine block known: as matched
    assert hit_tokens(request, 20, plain) == 320
    assert hit_tokens(request, 20, sim) == 304  # the last token is always computed
    assert hit_tokens(request, 20, vllm) == 256  # whole 128-token blocks below 319
    assert hit_tokens(request, 7, vllm) == 0  # 112 matched tokens fill no engine block
    assert hit_tokens(request, 9, vllm) == 128

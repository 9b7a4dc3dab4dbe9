"""Load- and cache-aware choice of instances, shared by every policy."""

from __future__ import annotations

from collections.abc import Mapping

from policies.estimates import Placement, hit_tokens, link_between, prefill_delay_s
from policies.tiers import Tier
from policies.types import ClusterView, InstanceLoad, Matches, RequestView

__all__ = ["choose_decode", "choose_least_loaded", "choose_prefill"]


def choose_prefill(
    request: RequestView, cluster: ClusterView, matches: Mapping[str, int]
) -> tuple[InstanceLoad, int, float]:
    """The P instance that finishes this prefill first: (instance, hit blocks, delay in s)."""
    pool = cluster.pool(Tier.P)
    if not pool:
        raise LookupError("no healthy prefill instance")
    best: tuple[float, str, InstanceLoad, int] | None = None
    for inst in pool:
        blocks = matches.get(inst.instance_id, 0)
        delay = prefill_delay_s(
            inst, request.input_length - hit_tokens(request, blocks, inst), cluster
        )
        key = (delay, inst.instance_id)
        if best is None or key < (best[0], best[1]):
            best = (delay, inst.instance_id, inst, blocks)
    assert best is not None
    return best[2], best[3], best[0]


def choose_decode(
    request: RequestView,
    cluster: ClusterView,
    tier: Tier,
    source: InstanceLoad,
    matches: Mapping[str, int],
    *,
    reuse_cache: bool,
    load_weight_s: float,
) -> Placement | None:
    """The decode instance minimizing transfer time plus a load penalty; None if the pool is empty.

    With ``reuse_cache`` only the blocks the instance lacks are shipped (DRC); without
    it the whole prompt's KV crosses the link whatever the instance holds.
    """
    pool = cluster.pool(tier)
    best: tuple[float, str, InstanceLoad, int, float, float] | None = None
    for inst in pool:
        if inst.kv_free_tokens < request.input_length and inst.running > 0:
            continue  # would queue for memory; other instances first
        blocks = matches.get(inst.instance_id, 0) if reuse_cache else 0
        missing = request.input_length - hit_tokens(request, blocks, inst)
        nbytes = missing * cluster.kv_bytes_per_token
        seconds = link_between(cluster, source, inst).transfer_s(nbytes)
        score = seconds + load_weight_s * inst.occupancy
        if best is None or (score, inst.instance_id) < (best[0], best[1]):
            best = (score, inst.instance_id, inst, blocks, nbytes, seconds)
    if best is not None:
        score, _, inst, blocks, nbytes, seconds = best
        return Placement(inst, blocks, nbytes, seconds, score)
    if pool:
        # every instance is short of KV memory: take the emptiest one, it will queue
        inst = max(pool, key=lambda i: (i.kv_free_tokens, i.instance_id))
        blocks = matches.get(inst.instance_id, 0) if reuse_cache else 0
        nbytes = (
            request.input_length - hit_tokens(request, blocks, inst)
        ) * cluster.kv_bytes_per_token
        seconds = link_between(cluster, source, inst).transfer_s(nbytes)
        return Placement(inst, blocks, nbytes, seconds, seconds + load_weight_s)
    return None


def choose_main_decode(
    request: RequestView,
    cluster: ClusterView,
    source: InstanceLoad,
    matches: Matches,
    *,
    load_weight_s: float,
) -> Placement:
    """The MD instance for a request prefilled on ``source``, its prefix cache reused;
    LookupError when no MD instance is healthy."""
    md = choose_decode(
        request, cluster, Tier.MD, source, matches.get(Tier.MD, {}),
        reuse_cache=True, load_weight_s=load_weight_s,
    )  # fmt: skip
    if md is None:
        raise LookupError("no healthy main-decode instance")
    return md


def choose_least_loaded(cluster: ClusterView, tier: Tier) -> InstanceLoad | None:
    """The healthy instance of a tier with the lowest occupancy (ties by id)."""
    pool = cluster.pool(tier)
    if not pool:
        return None
    return min(pool, key=lambda i: (i.occupancy, i.instance_id))

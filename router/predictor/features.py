"""The features of one (request, candidate instance) pair, as the scheduler sees them.

The same function builds the rows the model predicts on (every candidate, before the
decision) and the rows the decision log keeps (the chosen instances), so training and
serving read identical numbers. Missing values (no matched block, hence no age) are NaN
in the arrays and null in the log.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from policies.estimates import hit_tokens
from policies.tiers import Tier
from policies.types import ClusterView, InstanceLoad, RequestView
from router.predictor.tracking import InstanceActivity, TrackedIndex

__all__ = ["FEATURES", "TRANSFERABLE", "CandidateRows", "FeatureBuilder", "FloatArray"]

FloatArray = npt.NDArray[np.float64]

FEATURES: tuple[str, ...] = (
    "tier_p",  # one-hot tier of the candidate
    "tier_rld",
    "tier_md",
    "approximate",  # 1 when the index is the router's own record (no KV events)
    "match_frac",  # index: leading prompt tokens the instance holds, over the prompt
    "route_frac",  # the same from the router's own record of where it sent requests
    "known_frac",  # the larger of the two: held by what either source says
    "tier_best_frac",  # best index match among the tier's instances
    "log_input",  # log(1 + prompt tokens)
    "chain_blocks",  # blocks of the prompt's chain
    "match_age_s",  # seconds since the deepest matched block was stored (NaN: no match)
    "inserted_since",  # blocks the instance took in since then, over its KV blocks (NaN: none)
    "index_fill",  # blocks the index records on the instance, over its KV blocks
    "store_rate",  # blocks stored per second (decayed), over its KV blocks
    "evict_rate",  # blocks removed per second (decayed), over its KV blocks
    "occupancy",  # batch slots in use
    "kv_used_frac",  # pinned KV (requests in flight) over KV capacity
    "running",
    "queued",
    "wait_s",  # predicted wait before the KV is used: P's queue, or the prefill for decode
    "turnover_before_use",  # inserted_since + store_rate * wait_s (capacities)
    "wan_backlog_s",  # WAN backlog over its bandwidth
    "wan_active",  # transfers on the WAN
    "session_turn",  # earlier requests of the session
    "since_last_turn_s",  # seconds since the session's previous request (NaN: none)
    "touched_since",  # distinct blocks touched since the deepest match, over its KV blocks
    "lru_frac",  # leading prompt tokens an LRU of the instance's KV size would still hold
)
TRANSFERABLE: tuple[str, ...] = (
    "tier_p",
    "tier_rld",
    "tier_md",
    "approximate",
    "match_frac",
    "route_frac",
    "known_frac",
    "tier_best_frac",
    "inserted_since",
    "index_fill",
    "kv_used_frac",
    "occupancy",
    "touched_since",
    "lru_frac",
)
"""The features that mean the same on any trace: fractions of the prompt, of the KV memory,
of the batch. Absolute sizes, times and rates (prompt tokens, seconds, requests queued)
describe one trace and one cluster; trees that split on them do not carry over."""
_COL = {name: i for i, name in enumerate(FEATURES)}
_TIER_COL = {Tier.P: _COL["tier_p"], Tier.RLD: _COL["tier_rld"], Tier.MD: _COL["tier_md"]}


@dataclass(frozen=True, slots=True)
class CandidateRows:
    """Feature rows of candidate instances: ``keys[i]`` is the (tier, instance) of row i."""

    keys: list[tuple[Tier, str]]
    values: FloatArray

    def as_dict(self, i: int) -> dict[str, float | None]:
        """Row ``i`` by feature name, NaN as None (the decision log's form)."""
        return {
            name: None if math.isnan(v) else round(float(v), 6)
            for name, v in zip(FEATURES, self.values[i], strict=True)
        }


def _frac(request: RequestView, blocks: int) -> float:
    return hit_tokens(request, blocks) / max(request.input_length, 1)


class FeatureBuilder:
    """Builds candidate rows from the request, the cluster view, the index and its history."""

    def __init__(self, tracker: TrackedIndex | None, *, approximate: bool) -> None:
        self.tracker = tracker
        self.approximate = approximate

    def build(
        self,
        request: RequestView,
        cluster: ClusterView,
        matches: Mapping[Tier, Mapping[str, int]],
        routes: Mapping[Tier, Mapping[str, int]],
        now: float,
        only: Mapping[Tier, str] | None = None,
    ) -> CandidateRows:
        """Rows for every healthy instance of every tier, or only for ``only[tier]``."""
        loads: dict[str, InstanceLoad] = {
            i.instance_id: i for tier in Tier for i in cluster.pool(tier)
        }  # fmt: skip
        rate = max(cluster.prefill_tokens_per_s, 1e-9)
        p_matches = matches.get(Tier.P, {})
        # the wait of a decode copy: the quickest prefill (the P choice is not known yet)
        prefill_tokens = min(
            (
                i.queued_prefill_tokens
                + request.input_length
                - hit_tokens(request, p_matches.get(i.instance_id, 0))
                for i in cluster.pool(Tier.P)
            ),
            default=request.input_length,
        )
        prefill_wait = prefill_tokens / rate
        common = np.full(len(FEATURES), np.nan)
        common[list(_TIER_COL.values())] = 0.0
        common[_COL["approximate"]] = 1.0 if self.approximate else 0.0
        common[_COL["log_input"]] = math.log1p(request.input_length)
        common[_COL["chain_blocks"]] = len(request.chain)
        wan = cluster.wan
        common[_COL["wan_backlog_s"]] = wan.backlog_bytes / wan.bandwidth_bps if wan else 0.0
        common[_COL["wan_active"]] = wan.active_transfers if wan else 0.0
        history = request.history
        common[_COL["session_turn"]] = history.turns if history is not None else 0.0
        if history is not None and history.turns:
            common[_COL["since_last_turn_s"]] = history.since_last_s

        keys: list[tuple[Tier, str]] = []
        rows: list[FloatArray] = []
        for tier in Tier:
            tier_matches = matches.get(tier, {})
            best = max(tier_matches.values(), default=0)
            ids = [only[tier]] if only is not None and tier in only else None
            if only is not None and ids is None:
                continue
            for iid in ids if ids is not None else sorted(tier_matches):
                load = loads.get(iid)
                if load is None:
                    continue
                row = common.copy()
                row[_TIER_COL[tier]] = 1.0
                row[_COL["tier_best_frac"]] = _frac(request, best)
                blocks = tier_matches.get(iid, 0)
                row[_COL["match_frac"]] = _frac(request, blocks)
                routed = _frac(request, routes.get(tier, {}).get(iid, 0))
                row[_COL["route_frac"]] = routed
                row[_COL["known_frac"]] = max(routed, row[_COL["match_frac"]])
                wait = load.queued_prefill_tokens / rate if tier is Tier.P else prefill_wait
                self._instance(row, request, load, blocks, wait, now)
                keys.append((tier, iid))
                rows.append(row)
        values = np.vstack(rows) if rows else np.empty((0, len(FEATURES)))
        return CandidateRows(keys, values)

    def _instance(
        self,
        row: FloatArray,
        request: RequestView,
        load: InstanceLoad,
        blocks: int,
        wait: float,
        now: float,
    ) -> None:
        cap_tokens = max(load.kv_capacity_tokens, 1)
        row[_COL["occupancy"]] = load.occupancy
        row[_COL["kv_used_frac"]] = load.kv_used_tokens / cap_tokens
        row[_COL["running"]] = load.running
        row[_COL["queued"]] = load.queued
        row[_COL["wait_s"]] = wait
        tracker = self.tracker
        activity = tracker.activity(load.instance_id) if tracker is not None else None
        if tracker is None or activity is None:
            return
        # in blocks of the engine's KV memory, whatever bound the index itself keeps
        capacity = max(load.kv_capacity_tokens / max(request.block_size, 1), 1.0)
        stores, evictions = activity.rates(now, tracker.rate_window_s)
        row[_COL["index_fill"]] = len(activity.touch) / capacity
        row[_COL["store_rate"]] = stores / capacity
        row[_COL["evict_rate"]] = evictions / capacity
        blocks = min(blocks, len(request.chain))
        held = lru_blocks(activity, request.chain, blocks, capacity)
        row[_COL["lru_frac"]] = _frac(request, held)
        if blocks <= 0:
            return
        touched = activity.touch.get(request.chain[blocks - 1])
        if touched is None:
            return
        since = (activity.inserted - touched[1]) / capacity
        row[_COL["match_age_s"]] = max(now - touched[0], 0.0)
        row[_COL["inserted_since"]] = since
        row[_COL["turnover_before_use"]] = since + stores / capacity * wait
        row[_COL["touched_since"]] = activity.order.newer_than(touched[2]) / capacity


def lru_blocks(
    activity: InstanceActivity, chain: Sequence[int], blocks: int, capacity: float
) -> int:
    """Leading blocks of ``chain`` (of its first ``blocks``) that an LRU cache of
    ``capacity`` blocks fed with what the instance stored would still hold.

    A block survives while fewer than ``capacity`` blocks were touched after it. Along a
    chain, stamps never grow with depth (touching a block touches its prefix), so the
    held blocks are a prefix, found by bisection. Within the stamp at the edge (one
    stored chain), the LRU evicts the deepest blocks first: only the
    ``capacity - newer`` shallowest of that stamp's blocks remain.
    """
    touch, order = activity.touch, activity.order

    def stamp(k: int) -> int | None:
        known = touch.get(chain[k])
        return None if known is None else known[2]

    def held(k: int) -> bool:
        s = stamp(k)
        return s is not None and order.newer_than(s) < capacity

    lo, hi = 0, blocks  # held(k) for every k < lo; not held(hi) or hi == blocks
    while lo < hi:
        mid = (lo + hi) // 2
        if held(mid):
            lo = mid + 1
        else:
            hi = mid
    if lo == 0:
        return 0
    edge = stamp(lo - 1)
    assert edge is not None
    first, last = 0, lo - 1  # the first position of the edge stamp
    while first < last:
        mid = (first + last) // 2
        if stamp(mid) == edge:
            last = mid
        else:
            first = mid + 1
    room = capacity - order.newer_than(edge)
    return min(lo, first + max(math.ceil(room), 0))

"""The decision core: index matches per tier, the policy, and a JSON line per decision.

The live service and the replay simulator both call ``Scheduler.decide``; nothing
else decides. It is synchronous: with the Redis index the match is one round trip.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TextIO

from policies.base import Policy
from policies.tiers import Tier
from policies.types import ClusterView, Decision, RequestView
from router.index.base import PrefixIndex

__all__ = ["Scheduler"]


class Scheduler:
    """Turns a request and a view of the cluster into a Decision."""

    def __init__(
        self,
        index: PrefixIndex,
        policy: Policy,
        *,
        decision_log: TextIO | None = None,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.index = index
        self.policy = policy
        self.decision_log = decision_log
        self._timer = timer
        self._tier_of: dict[str, Tier] = {}
        self.decisions = 0
        self.decide_seconds = 0.0

    def refresh_instances(self) -> None:
        """Re-read which tier each instance belongs to (after registering or removing one)."""
        self._tier_of = {i.instance_id: i.tier for i in self.index.instances()}

    def matches(self, request: RequestView) -> dict[Tier, dict[str, int]]:
        """The index's answer for the request's chain, grouped by tier."""
        raw = self.index.match(request.chain)
        if any(iid not in self._tier_of for iid in raw):
            self.refresh_instances()
        grouped: dict[Tier, dict[str, int]] = {tier: {} for tier in Tier}
        for iid, blocks in raw.items():
            tier = self._tier_of.get(iid)
            if tier is not None:
                grouped[tier][iid] = blocks
        return grouped

    def decide(self, request: RequestView, cluster: ClusterView) -> Decision:
        start = self._timer()
        matches = self.matches(request)
        decision = self.policy.decide(request, cluster, matches)
        self.decide_seconds += self._timer() - start
        self.decisions += 1
        if self.decision_log is not None:
            self.decision_log.write(decision_line(request, cluster, matches, decision) + "\n")
        return decision


def decision_line(
    request: RequestView,
    cluster: ClusterView,
    matches: dict[Tier, dict[str, int]],
    decision: Decision,
) -> str:
    """One decision as a JSON line: what the scheduler saw, predicted and chose."""
    best = {
        tier.value: max(per_instance.values(), default=0) for tier, per_instance in matches.items()
    }
    record = {
        "t": cluster.now,
        "request": {
            "input_length": request.input_length,
            "blocks": len(request.chain),
            "block_size": request.block_size,
            "max_tokens": request.max_tokens,
            "session_id": request.session_id,
        },
        "best_match_blocks": best,
        "wan": None
        if cluster.wan is None
        else {
            "active_transfers": cluster.wan.active_transfers,
            "backlog_bytes": cluster.wan.backlog_bytes,
        },
        "decision": decision.model_dump(mode="json"),
    }
    return json.dumps(record, separators=(",", ":"), sort_keys=True)

"""Work a decision commits instances to, counted from the decision on.

The orchestrator counts a request's work on an instance (a prefill's prompt tokens, an
open stream) when it calls the engine, a few steps after the decision: on a busy machine
many milliseconds later. Until then the decision would be invisible, to the next decision
here and to the other replicas. So the decision claims that work at once, and each engine
call the orchestrator then counts takes the place of what is claimed on that instance
(``consume``): the instance's load is the same before and after the call starts. What is
left of a claim is dropped when the request has its first token or gives up (``release``).

Claims are added on the index lane and consumed on the event loop: a lock keeps them whole.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from policies.tiers import Tier
from policies.types import Decision, Pipeline

__all__ = ["Claims", "decision_load"]

Load = tuple[int, int]  # (streams, prefill tokens)


def decision_load(decision: Decision, prompt_tokens: int) -> dict[str, Load]:
    """What executing ``decision`` will put on each instance: the expected uncached prompt
    tokens on P (as the orchestrator counts them), a stream on each decoding instance."""
    hit = decision.predicted_hit.get(Tier.P, 0.0)
    uncached = max(prompt_tokens - round(hit * prompt_tokens), 1)
    colocated = decision.pipeline is Pipeline.COLOCATED
    parts: dict[str, Load] = {decision.p_instance: (1 if colocated else 0, uncached)}
    decoders = {
        Pipeline.P_MD: (decision.md_instance,),
        Pipeline.P_RLD: (decision.rld_instance,),
        Pipeline.P_RLD_MD: (decision.rld_instance, decision.md_instance),
    }.get(decision.pipeline, ())
    for iid in decoders:
        if iid is not None:
            streams, tokens = parts.get(iid, (0, 0))
            parts[iid] = (streams + 1, tokens)
    return parts


class Claims:
    """Claimed work per request key and its totals per instance."""

    def __init__(self) -> None:
        self._by_key: dict[str, dict[str, list[int]]] = {}
        self._totals: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def add(self, key: str, parts: Mapping[str, Load]) -> set[str]:
        """Claim ``parts`` for ``key`` (replacing what it claimed before); the instances
        whose claimed work changed."""
        touched = self.release(key)
        with self._lock:
            mine = self._by_key.setdefault(key, {})
            for iid, (streams, tokens) in parts.items():
                mine[iid] = [streams, tokens]
                total = self._totals.setdefault(iid, [0, 0])
                total[0] += streams
                total[1] += tokens
                touched.add(iid)
        return touched

    def release(self, key: str) -> set[str]:
        """Drop what is left of ``key``'s claim; the instances it still held work on."""
        with self._lock:
            mine = self._by_key.pop(key, {})
            for iid, (streams, tokens) in mine.items():
                self._take(iid, streams, tokens)
        return {iid for iid, (s, t) in mine.items() if s or t}

    def consume(self, instance_id: str, streams: int, tokens: int) -> bool:
        """An engine call now counts ``streams`` and ``tokens`` on the instance: as much of
        them is no longer claimed (oldest claims first). Whether any claim changed."""
        with self._lock:
            if instance_id not in self._totals:
                return False
            for mine in self._by_key.values():
                part = mine.get(instance_id)
                if part is None:
                    continue
                s, t = min(part[0], streams), min(part[1], tokens)
                part[0] -= s
                part[1] -= t
                streams -= s
                tokens -= t
                self._take(instance_id, s, t)
                if not streams and not tokens:
                    break
            return True

    def total(self, instance_id: str) -> Load:
        """Work claimed on the instance and not yet counted by an engine call."""
        total = self._totals.get(instance_id)
        return (total[0], total[1]) if total is not None else (0, 0)

    def _take(self, instance_id: str, streams: int, tokens: int) -> None:
        total = self._totals.get(instance_id)
        if total is None:
            return
        total[0] -= streams
        total[1] -= tokens
        if total == [0, 0]:
            del self._totals[instance_id]

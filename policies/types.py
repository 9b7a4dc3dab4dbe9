"""What a policy sees (request, cluster, index matches) and what it returns (a Decision)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from policies.tiers import Tier

__all__ = [
    "ClusterView",
    "Decision",
    "HandoffMode",
    "InstanceLoad",
    "LinkState",
    "Matches",
    "Pipeline",
    "RequestView",
    "SessionHistory",
]


class Pipeline(StrEnum):
    """How a request crosses the tiers."""

    P_MD = "P-MD"  # prefill in A, only the blocks MD lacks cross the link, decode on MD
    P_RLD_MD = "P-RLD-MD"  # KV to RLD (RDMA) and MD (WAN) at once; RLD decodes until handoff
    P_RLD = "P-RLD"  # odd traffic: RLD finishes the request, no WAN transfer
    COLOCATED = "colocated"  # one engine prefills and decodes the request: no KV moves


class HandoffMode(StrEnum):
    """How RLD's eager tokens reach MD (extend-decode by token IDs)."""

    ONE_SHOT = "one-shot"  # all eager tokens at once, RLD freed at once, one stall on MD
    CATCH_UP = "catch-up"  # chunks while RLD keeps decoding: several small stalls


@dataclass(frozen=True, slots=True)
class SessionHistory:
    """What the router knows at arrival of the earlier requests of the same session."""

    turns: int = 0  # earlier requests of the session the router has seen
    last_input_length: int = 0  # prompt length of the previous one
    since_last_s: float = 0.0  # seconds since the previous one arrived
    outputs_known: int = 0  # earlier requests whose output length has been reported
    mean_output: float | None = None  # their mean output length in tokens


@dataclass(frozen=True, slots=True)
class RequestView:
    """A request as the router sees it at arrival: never its actual output length."""

    chain: tuple[int, ...]
    block_size: int
    input_length: int
    max_tokens: int | None = None
    session_id: str | None = None
    arrival_s: float = 0.0
    request_id: str | None = None  # the driver's key, echoed in the decision log
    history: SessionHistory | None = None  # filled in by the scheduler when it tracks sessions


@dataclass(slots=True)
class InstanceLoad:
    """Live load of one instance; the driver (service or simulator) updates it in place."""

    instance_id: str
    tier: Tier
    datacenter: str
    kv_capacity_tokens: int
    kv_used_tokens: int = 0
    running: int = 0
    queued: int = 0
    queued_prefill_tokens: int = 0  # prompt tokens still to prefill, for queue-time estimates
    max_batch: int = 256
    healthy: bool = True
    # The engine's own KV block, in tokens, when it reports one: it reuses only whole blocks
    # and never the prompt's last token, so a hit counts in those (None: as matched)
    cache_block_tokens: int | None = None
    # requests the router has sent the instance that have not reached it yet (still in
    # prefill or on their way) and the KV tokens they will need there
    pending: int = 0
    pending_tokens: int = 0
    # a decode instance's step time now, when the driver knows it (0: unknown, the
    # cluster's typical step stands in)
    step_s: float = 0.0

    @property
    def kv_free_tokens(self) -> int:
        return max(self.kv_capacity_tokens - self.kv_used_tokens, 0)

    @property
    def kv_uncommitted_tokens(self) -> int:
        """KV tokens free once the requests already on their way here have landed."""
        return max(self.kv_capacity_tokens - self.kv_used_tokens - self.pending_tokens, 0)

    @property
    def occupancy(self) -> float:
        """Share of the batch slots in use (0 idle, 1 full)."""
        return min((self.running + self.queued) / self.max_batch, 1.0) if self.max_batch else 1.0


@dataclass(slots=True)
class LinkState:
    """A link between datacenters (or inside one) as the router sees it now."""

    bandwidth_bps: float
    rtt_s: float
    active_transfers: int = 0
    backlog_bytes: float = 0.0

    def share_bps(self) -> float:
        """Bandwidth a new transfer would get under processor sharing."""
        return self.bandwidth_bps / (self.active_transfers + 1)

    def transfer_s(self, nbytes: float) -> float:
        """Predicted time to move ``nbytes`` if started now: RTT/2 plus processor sharing.

        Under processor sharing a new transfer of x bytes finishes after the link has
        carried x plus min(r_i, x) of every transfer i ahead of it; with only the
        count k and the total backlog B known, that sum is taken as min(B, k*x).
        """
        if nbytes <= 0:
            return 0.0
        ahead = min(self.backlog_bytes, self.active_transfers * nbytes)
        return self.rtt_s / 2 + (nbytes + ahead) / self.bandwidth_bps


@dataclass(slots=True)
class ClusterView:
    """The cluster as the router sees it: instances by tier, the links, cost figures."""

    instances: Mapping[Tier, list[InstanceLoad]]
    wan: LinkState | None  # None when there is no cross-datacenter link (intra-DC deployment)
    rdma: LinkState
    kv_bytes_per_token: float
    prefill_tokens_per_s: float  # one P instance's prefill throughput, for TTFT estimates
    decode_step_s: float  # a typical decode step on an MD instance
    now: float = 0.0
    datacenter_of_tier: dict[Tier, str] = field(default_factory=dict)

    def pool(self, tier: Tier) -> list[InstanceLoad]:
        return [i for i in self.instances.get(tier, []) if i.healthy]


Matches = Mapping[Tier, Mapping[str, int]]
"""Index answer per tier: instance id -> number of leading blocks of the chain it holds."""


class Decision(BaseModel):
    """What the router decided for one request, with the prediction behind it."""

    model_config = ConfigDict(frozen=True)

    policy: str
    pipeline: Pipeline
    p_instance: str
    rld_instance: str | None = None
    md_instance: str | None = None
    handoff: HandoffMode | None = None
    chunk_tokens: int | None = Field(None, description="Catch-up chunk size in tokens")
    reuse_md_cache: bool = Field(True, description="Ship only the blocks MD lacks (DRC)")
    predicted_hit: dict[Tier, float] = Field(default_factory=dict)
    predicted_wan_bytes: float = 0.0
    predicted_wan_s: float = 0.0
    predicted_ttft_s: float = 0.0
    reason: str = ""

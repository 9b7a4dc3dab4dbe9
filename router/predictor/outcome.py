"""What happened to a decided request: the other half of a decision-log join.

The simulator reports it when a request finishes; the live service builds it from what
the engine reports (``usage.prompt_tokens_details.cached_tokens``, or KV events). The
scheduler writes it to the decision log as an ``"kind": "outcome"`` line with the
decision's ``id``; readers join the two by that id.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from policies.tiers import Tier

__all__ = ["DecisionOutcome", "OutcomeSource"]

OutcomeSource = Literal["usage", "kv-events"]


class DecisionOutcome(BaseModel):
    """Realized figures of one request, keyed by the id its decision line carries."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    request_id: str
    session_id: str | None = None
    realized_hit: dict[Tier, float] = Field(
        default_factory=dict,
        description="Per tier used: leading prompt tokens cached on the serving instance at "
        "use, over the prompt",
    )
    instances: dict[Tier, str] = Field(default_factory=dict)
    output_tokens: int | None = Field(None, ge=0)
    ttft_s: float | None = None
    transfer_s: float | None = None
    wan_bytes: float = 0.0
    pipeline: str | None = None
    finished_s: float | None = None
    source: OutcomeSource | None = Field(
        None,
        description="Where the live service read the realized hit: the engine's usage "
        "(cached prompt tokens) or its KV events; None (and not logged) for the simulator",
    )
    events_hit: dict[Tier, float] | None = Field(
        None,
        description="Live service, when the hit came from usage: the same hit read from the "
        "instance's KV events, a cross-check of the two sources (None: not logged)",
    )

    @classmethod
    def from_usage(
        cls,
        request_id: str,
        tier: Tier,
        instance_id: str,
        *,
        prompt_tokens: int,
        cached_tokens: int,
        output_tokens: int | None = None,
        session_id: str | None = None,
    ) -> DecisionOutcome:
        """An outcome from an engine's OpenAI ``usage`` (cached prompt tokens) on one tier."""
        hit = min(cached_tokens, prompt_tokens) / prompt_tokens if prompt_tokens > 0 else 0.0
        return cls(
            request_id=request_id,
            session_id=session_id,
            realized_hit={tier: hit},
            instances={tier: instance_id},
            output_tokens=output_tokens,
            source="usage",
        )

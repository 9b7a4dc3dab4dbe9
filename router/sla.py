"""The service-level objective requests are judged by, with its default thresholds.

One place for the defaults: the service's experiment reports, the replay's summaries
and every command's ``--sla-ttft`` / ``--sla-tpot`` start from these.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SLA_TPOT_S", "SLA_TTFT_S", "SlaThresholds"]

SLA_TTFT_S = 10.0
"""Default SLA on time to first token, seconds."""
SLA_TPOT_S = 0.1
"""Default SLA on time per output token, seconds."""


class SlaThresholds(BaseModel):
    """A request meets the SLA when its TTFT and its TPOT are both within these."""

    model_config = ConfigDict(frozen=True)

    ttft_s: float = Field(SLA_TTFT_S, gt=0, description="SLA on time to first token, seconds")
    tpot_s: float = Field(SLA_TPOT_S, gt=0, description="SLA on time per output token, seconds")

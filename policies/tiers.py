"""The serving tiers of a PDD deployment."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Tier"]


class Tier(StrEnum):
    """Where an instance sits in the pipeline.

    P prefills (datacenter A), RLD relay-decodes (datacenter A, RDMA to P),
    MD main-decodes (datacenter B, across the WAN). Intra-datacenter baselines
    use P and MD in one datacenter.
    """

    P = "p"
    RLD = "rld"
    MD = "md"

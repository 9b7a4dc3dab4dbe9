"""`idc-pd`: intra-datacenter PD, prefill and decode in one datacenter over RDMA."""

from __future__ import annotations

from policies.config import IdcPdParams
from policies.plain_pd import p_md_decision
from policies.types import ClusterView, Decision, Matches, RequestView

__all__ = ["IdcPdPolicy"]


class IdcPdPolicy:
    """Every request P-MD with the decode pool next to prefill; the KV moves over RDMA."""

    name = "idc-pd"

    def __init__(self, params: IdcPdParams) -> None:
        self.params = params

    def decide(self, request: RequestView, cluster: ClusterView, matches: Matches) -> Decision:
        return p_md_decision(
            self.name, request, cluster, matches, reuse_md_cache=True,
            load_weight_s=self.params.load_weight_s, reason="intra-datacenter PD: KV over RDMA",
        )  # fmt: skip

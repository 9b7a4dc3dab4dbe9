"""`idc-pd`: intra-datacenter PD, prefill and decode in one datacenter over RDMA."""

from __future__ import annotations

from policies.plain_pd import PlainPdPolicy

__all__ = ["IdcPdPolicy"]


class IdcPdPolicy(PlainPdPolicy):
    """Every request P-MD with the decode pool next to prefill; the KV moves over RDMA."""

    name = "idc-pd"
    reuse_md_cache = True
    reason = "intra-datacenter PD: KV over RDMA"

"""`xdc-pd`: naive cross-datacenter PD, the full prompt KV over the WAN for every request."""

from __future__ import annotations

from policies.config import XdcPdParams
from policies.plain_pd import p_md_decision
from policies.types import ClusterView, Decision, Matches, RequestView

__all__ = ["XdcPdPolicy"]


class XdcPdPolicy:
    """Every request P-MD; no decode-side cache, so the whole prompt's KV crosses the WAN."""

    name = "xdc-pd"

    def __init__(self, params: XdcPdParams) -> None:
        self.params = params

    def decide(self, request: RequestView, cluster: ClusterView, matches: Matches) -> Decision:
        return p_md_decision(
            self.name, request, cluster, matches, reuse_md_cache=False,
            load_weight_s=self.params.load_weight_s,
            reason="naive cross-datacenter PD: full KV over the WAN",
        )  # fmt: skip

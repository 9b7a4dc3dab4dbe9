"""The cross-datacenter PD baselines: `xdc-pd`, naive (the full prompt KV over the WAN for
every request), and `xdc-pd-drc`, with the decode side's prefix cache (only the blocks MD
lacks cross the WAN) but no RLD. Between them and `pdd` they separate what DRC and what
RLD contribute."""

from __future__ import annotations

from policies.config import XdcPdDrcParams, XdcPdParams
from policies.plain_pd import p_md_decision
from policies.types import ClusterView, Decision, Matches, RequestView

__all__ = ["XdcPdDrcPolicy", "XdcPdPolicy"]


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


class XdcPdDrcPolicy:
    """Every request P-MD; MD's prefix cache (DRC) holds earlier turns, so only the blocks
    it lacks cross the WAN. No RLD: a request whose delta is large waits for it."""

    name = "xdc-pd-drc"

    def __init__(self, params: XdcPdDrcParams) -> None:
        self.params = params

    def decide(self, request: RequestView, cluster: ClusterView, matches: Matches) -> Decision:
        return p_md_decision(
            self.name, request, cluster, matches, reuse_md_cache=True,
            load_weight_s=self.params.load_weight_s,
            reason="cross-datacenter PD with DRC: the uncached delta over the WAN",
        )  # fmt: skip

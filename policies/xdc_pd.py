"""The cross-datacenter PD baselines: `xdc-pd`, naive (the full prompt KV over the WAN for
every request), and `xdc-pd-drc`, with the decode side's prefix cache (only the blocks MD
lacks cross the WAN) but no RLD. Between them and `pdd` they separate what DRC and what
RLD contribute."""

from __future__ import annotations

from policies.plain_pd import PlainPdPolicy

__all__ = ["XdcPdDrcPolicy", "XdcPdPolicy"]


class XdcPdPolicy(PlainPdPolicy):
    """Every request P-MD; no decode-side cache, so the whole prompt's KV crosses the WAN."""

    name = "xdc-pd"
    reuse_md_cache = False
    reason = "naive cross-datacenter PD: full KV over the WAN"


class XdcPdDrcPolicy(PlainPdPolicy):
    """Every request P-MD; MD's prefix cache (DRC) holds earlier turns, so only the blocks
    it lacks cross the WAN. No RLD: a request whose delta is large waits for it."""

    name = "xdc-pd-drc"
    reuse_md_cache = True
    reason = "cross-datacenter PD with DRC: the uncached delta over the WAN"

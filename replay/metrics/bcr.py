"""BCR (benefit-cost ratio): an SLA goodput per 1000 USD/h of the cluster's hardware.

The BCR proper is the SLA goodput at capacity (``replay sweep``, ``replay plan``); a run at
one rate (``replay run``, ``demo``, ``compare``, ``tune``) gives the BCR at the trace's
rate, named so (``bcr_at_trace_rate_per_1000_usd_h``). Both are req/s per 1000 USD/h.
"""

from __future__ import annotations

__all__ = ["bcr_per_1000_usd_h"]


def bcr_per_1000_usd_h(sla_goodput_req_s: float, cost_usd_h: float) -> float:
    """``sla_goodput_req_s`` (req/s) per 1000 USD/h of ``cost_usd_h``; 0 for a cluster that
    costs nothing (no price to divide by)."""
    return sla_goodput_req_s / cost_usd_h * 1000 if cost_usd_h > 0 else 0.0

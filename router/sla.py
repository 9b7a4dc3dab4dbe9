"""The service-level objective requests are judged by: its default thresholds, in one place.

The service's experiment reports, the replay's summaries (``SlaThresholds`` in
``replay.metrics.summary``) and every command's ``--sla-ttft`` / ``--sla-tpot`` start from
these. Plain numbers, so the command line can show them without importing anything.
"""

from __future__ import annotations

__all__ = ["SLA_TPOT_S", "SLA_TTFT_S"]

SLA_TTFT_S = 10.0
"""Default SLA on time to first token, seconds."""
SLA_TPOT_S = 0.1
"""Default SLA on time per output token, seconds."""

"""Admission control: refusing a request the cluster cannot serve within the SLA now.

Past its capacity a deployment that admits everything lets a queue grow (the prefill
queue, the WAN backlog, RLD's or MD's waiting list) until every request misses the SLA. A policy
that refuses the excess instead keeps the requests it admits within the SLA, so its
SLA goodput stays near its capacity. A refusal is the ``Overloaded`` exception: the live
service answers 429 with ``Retry-After``; the replay counts the request as rejected.
"""

from __future__ import annotations

import math
from enum import StrEnum

__all__ = ["Bottleneck", "Overloaded"]


class Bottleneck(StrEnum):
    """The resource whose queue would make the request miss the SLA."""

    PREFILL = "prefill"  # the prefill queue
    WAN = "wan"  # the line's backlog, with RLD full
    RLD = "rld"  # relay decode full and the WAN copy too slow
    MD = "md"  # main decode full: the request would wait for a slot there


class Overloaded(Exception):
    """The policy refuses the request: the predicted TTFT would miss the SLA."""

    def __init__(
        self,
        policy: str,
        bottleneck: Bottleneck,
        retry_after_s: float,
        reason: str,
        *,
        alone_s: float | None = None,
    ) -> None:
        super().__init__(reason)
        self.policy = policy
        self.bottleneck = bottleneck
        self.retry_after_s = max(retry_after_s, 0.0)
        self.reason = reason
        self.alone_s = alone_s
        """The request's own first-token time with nothing queued ahead of it, when that
        alone misses the limit: retrying later cannot help (None: the load is the cause)."""

    @property
    def retry_after_header(self) -> str:
        """Whole seconds for a ``Retry-After`` header: at least 1."""
        return str(max(math.ceil(self.retry_after_s), 1))

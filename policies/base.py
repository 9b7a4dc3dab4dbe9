"""The policy interface: a pure function from what the router sees to a Decision."""

from __future__ import annotations

from typing import Protocol

from policies.types import ClusterView, Decision, Matches, RequestView

__all__ = ["Policy"]


class Policy(Protocol):
    """Decides one request. Pure: no I/O, no clock, no state beyond its parameters."""

    name: str

    def decide(self, request: RequestView, cluster: ClusterView, matches: Matches) -> Decision:
        """Pipeline, instances, handoff and the prediction behind them."""
        ...

"""What a request may learn of the shared prefix cache: predictions only for its own salt.

A predicted hit tells whoever reads it whether someone sent the same prefix, and so do
the figures that follow from it (the WAN bytes and time, the TTFT, the decision's reason).
A request with a ``cache_salt`` is hashed with it, by the router and by the engines, so
its prediction covers only its own salt's blocks and is shown. A request without one
shares the cache of every other unsalted request: its predictions are shown only when
the operator turns ``service.show_shared_predictions`` on.
"""

from __future__ import annotations

from policies.types import Decision
from router.settings import ServiceSettings

__all__ = ["PREDICTION_FIELDS", "decision_json", "shows_predictions"]

PREDICTION_FIELDS = frozenset(
    {"predicted_hit", "predicted_wan_bytes", "predicted_wan_s", "predicted_ttft_s", "reason"}
)
"""The fields of a decision that depend on what the shared cache holds."""


def shows_predictions(service: ServiceSettings, cache_salt: str | None) -> bool:
    """Whether a request with this salt (None: none) is shown the router's predictions."""
    return service.show_shared_predictions or bool(cache_salt)


def decision_json(decision: Decision, visible: bool) -> bytes:
    """A decision as ``/v1/route`` answers it: without the predictions when not visible."""
    return decision.model_dump_json(exclude=None if visible else set(PREDICTION_FIELDS)).encode()

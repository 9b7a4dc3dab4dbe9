"""Generation requests refused before ``Generation.start``, counted by outcome.

A request that reaches ``Generation.start`` is counted by its ``RequestMetrics``; one
refused on the way is counted here, in the same ``pdd_router_requests_total`` with the
pipeline ``none``: an unknown model (404), a prompt the tokenizer or chat template
refuses (400), a body that fails validation (422, or 400 for a value over a limit), a
body over the size limit (413, answered by ``BodyLimit`` before any handler runs), a
missing or wrong key (401, 403). The middleware sits outside every other one so that it
sees each of these answers; the endpoint tells it the model once resolved and when the
request goes on to ``Generation.start`` (``Admission``).
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.service.models import ResolvedModel
from router.service.request_metrics import (
    NO_PIPELINE,
    UNKNOWN_MODEL,
    RequestFamilies,
    model_label,
    refusal_outcome,
)

__all__ = ["ADMISSION_SCOPE", "GENERATION_PATHS", "Admission", "RefusalCount"]

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
ADMISSION_SCOPE = "pdd_router.admission"
"""Where a generation request's ``Admission`` is kept in its ASGI scope."""


class Admission:
    """One generation request on its way to ``Generation.start``: its model's label once
    resolved (``unknown`` before), and whether it got there."""

    __slots__ = ("model", "started")

    def __init__(self) -> None:
        self.model = UNKNOWN_MODEL
        self.started = False

    def resolved(self, model: ResolvedModel) -> None:
        """The request's model is known (labelled as the registry names it)."""
        self.model = model_label(model)

    def starting(self) -> None:
        """The request goes to ``Generation.start``: its metrics count it from here."""
        self.started = True


class RefusalCount:
    """ASGI middleware: a generation request that never reached ``Generation.start`` is
    counted under the outcome its status says (``refusal_outcome``)."""

    def __init__(self, app: ASGIApp, families: Callable[[Scope], RequestFamilies | None]) -> None:
        self.app = app
        self.families = families  # the service's, once its lifespan has started

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] not in GENERATION_PATHS
        ):
            await self.app(scope, receive, send)
            return
        admission = Admission()
        scope[ADMISSION_SCOPE] = admission
        status: int | None = None

        async def tracked_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        except Exception:
            if status is None:
                status = 500  # nothing answered it (a cancellation stays None: abort)
            raise
        finally:
            if not admission.started and (status is None or status >= 400):
                self._count(scope, admission.model, refusal_outcome(status))

    def _count(self, scope: Scope, model: str, outcome: str) -> None:
        families = self.families(scope)
        if families is not None:
            families.requests.labels(model, NO_PIPELINE, outcome).inc()

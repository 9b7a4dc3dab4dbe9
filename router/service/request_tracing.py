"""A request's OpenTelemetry spans, one per stage, under the HTTP request's span:

- ``pdd.tokenize``: the prompt (or chat) turned into token IDs;
- ``pdd.decide``: the decision (``decide.py``);
- ``pdd.prefill``: the prefill call on P (colocated: the wait for the engine's first token);
- ``pdd.transfer``: the KV reaching a decode instance: from the decode call until its first
  token (the engine pulls the prefilled KV, then decodes a step), and MD's copy of the
  prompt's KV across the WAN before a handoff;
- ``pdd.handoff``: MD catching up on RLD's eager tokens (catch-up chunks) and the switch,
  until MD's first token;
- ``pdd.stream``: a decode instance's tokens, from its first to its last.

Every engine span names its instance (``pdd.instance``). The HTTP span comes from
OpenTelemetry's FastAPI instrumentation, installed only when tracing is on: with the
no-op provider of a service without ``OTEL_*`` settings the request path pays nothing.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI
from opentelemetry import context, trace
from opentelemetry.trace import Status, StatusCode, Tracer, TracerProvider

__all__ = ["HANDOFF", "PREFILL", "STREAM", "TOKENIZE", "TRANSFER", "StreamSpans", "instrument"]

TOKENIZE = "pdd.tokenize"
PREFILL = "pdd.prefill"
TRANSFER = "pdd.transfer"
HANDOFF = "pdd.handoff"
STREAM = "pdd.stream"


def instrument(app: FastAPI, provider: TracerProvider) -> None:
    """A span per HTTP request, the parent of its stages' spans, when ``provider`` records
    (its per-message send and receive spans left out: a stream sends one per token; the
    probes' and scrapers' requests left out too)."""
    if isinstance(provider, trace.NoOpTracerProvider):
        return
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(
        app, tracer_provider=provider, exclude_spans=["receive", "send"],
        excluded_urls="/healthz,/readyz,/metrics",
    )  # fmt: skip


class StreamSpans:
    """An engine stream's two stages as spans, written when each ends: the wait for its
    first token (``wait``: prefill, transfer or handoff) and its tokens (``pdd.stream``).
    Both are children of the span current when the stream was asked for; the stream runs
    across the client's reads, so neither is made current."""

    def __init__(self, tracer: Tracer, instance_id: str, wait: str, prompt_tokens: int) -> None:
        self._tracer = tracer
        self._wait = wait
        self._parent = context.get_current()
        self._attributes: dict[str, Any] = {
            "pdd.instance": instance_id,
            "pdd.prompt_tokens": prompt_tokens,
        }
        self._asked = time.time_ns()
        self._first: int | None = None
        self._error: BaseException | None = None

    def first_token(self) -> None:
        """The stream's first token came: its wait ends."""
        if self._first is None:
            self._first = time.time_ns()
            self._span(self._wait, self._asked, self._first, {})

    def failed(self, exc: BaseException) -> None:
        self._error = exc

    def end(self, tokens: int) -> None:
        """The stream ended after ``tokens`` tokens: the stage it was in ends now (with the
        error it failed on, if any)."""
        now = time.time_ns()
        if self._first is None:
            self._span(self._wait, self._asked, now, {}, self._error)
        else:
            self._span(STREAM, self._first, now, {"pdd.tokens": tokens}, self._error)

    def _span(
        self,
        name: str,
        start: int,
        end: int,
        extra: dict[str, Any],
        error: BaseException | None = None,
    ) -> None:
        span = self._tracer.start_span(
            name, context=self._parent, start_time=start,
            attributes={**self._attributes, **extra},
        )  # fmt: skip
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, str(error)))
        span.end(end_time=end)

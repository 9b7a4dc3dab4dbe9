"""Per-request metrics, as an operator reads them next to the engines' own (vLLM's names,
with the ``pdd_router_`` prefix): time to first token, inter-token latency and end-to-end
latency histograms, prompt, generation and cached-token counters, requests by outcome, and
the requests in flight and still waiting for their first token.

``RequestFamilies`` holds the metric families on the service's registry; a
``RequestMetrics`` records one request from its arrival at ``Generation.start`` to its end.
Latencies and token counts are labelled by ``model`` and ``pipeline``: the model as the
registry names it (``model_label``: never a name the client made up) and the pipeline the
request was decided on (``none`` for a request refused before a decision). Every label
takes its values from a bounded set: ``outcome`` is a finish reason or an error kind from
``OUTCOMES``, an engine's other finish reasons count as ``other``. A request the
endpoints refuse before ``Generation.start`` (``refusals``) counts under the kind its
status says (``refusal_outcome``), with the model ``unknown`` when its model was not
resolved yet.
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from engines_adapter.contract import EngineError
from policies.types import Decision
from router.service.errors import ApiError
from router.service.models import DEFAULT_MODEL, ResolvedModel
from router.service.token_tally import TokenTally

__all__ = [
    "FINISH_REASONS",
    "OUTCOMES",
    "UNKNOWN_MODEL",
    "RequestFamilies",
    "RequestMetrics",
    "model_label",
    "refusal_outcome",
]

# vLLM's buckets (vllm/v1/metrics/loggers.py), the inter-token ones extended below 10 ms:
# the router relays engines that decode a token in a few ms
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
               0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip

FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "abort"})
"""Finish reasons counted under their own name (``abort``: the client left)."""
ERROR_KINDS = frozenset({"rejected", "engine_busy", "unavailable", "invalid_request",
                         "engine_error", "error"})  # fmt: skip
REFUSALS = {400: "invalid_request", 401: "unauthorized", 403: "forbidden",
            404: "model_not_found", 413: "too_large", 422: "unprocessable", 429: "rejected",
            499: "abort", 502: "engine_error", 503: "unavailable"}  # fmt: skip
"""The outcome of a request refused before ``Generation.start``, by its status (any other
status: ``error``)."""
OUTCOMES = FINISH_REASONS | ERROR_KINDS | {"other"} | frozenset(REFUSALS.values())
NO_PIPELINE = "none"
UNKNOWN_MODEL = "unknown"
"""The model label of a request refused before its model was resolved."""


def model_label(model: ResolvedModel) -> str:
    """The model's name when the registry knows it (a setting or an instance names it),
    else the default model's: while nothing names a model any name a client sends is
    served as the default one, and must not become a series of its own."""
    known = model.settings is not None or model.instances_of is not None
    return model.name if known else DEFAULT_MODEL


def outcome_of(exc: BaseException) -> str:
    """The error kind a request's failure counts under."""
    if isinstance(exc, asyncio.CancelledError):
        return "abort"  # the client went away while its request ran
    if isinstance(exc, EngineError):
        return "invalid_request" if exc.cause == "request" else "engine_error"
    if not isinstance(exc, ApiError):
        return "error"
    if exc.status == 499:
        return "abort"
    if exc.status == 429:
        return "engine_busy" if exc.code == "engine_busy" else "rejected"
    if exc.status == 400:
        return "rejected" if exc.code == "first_token_limit" else "invalid_request"
    return {502: "engine_error", 503: "unavailable"}.get(exc.status, "error")


def refusal_outcome(status: int | None) -> str:
    """The outcome a request refused before ``Generation.start`` with ``status`` counts
    under (None: no response was sent, the client left)."""
    if status is None:
        return "abort"
    return REFUSALS.get(status, "error")


class RequestFamilies:
    """The per-request metric families, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        both = ["model", "pipeline"]
        self.ttft = Histogram(
            "pdd_router_ttft_seconds", "Time to first token as the router's client saw it, "
            "from the request's arrival (after tokenization) to its first token",
            [*both, "arm"], buckets=TTFT_BUCKETS, registry=r,
        )  # fmt: skip
        self.itl = Histogram(
            "pdd_router_inter_token_latency_seconds", "Time between two output tokens of a "
            "request as the router relayed them (a batch's gap shared among its tokens)",
            both, buckets=ITL_BUCKETS, registry=r,
        )  # fmt: skip
        self.e2e = Histogram(
            "pdd_router_e2e_request_latency_seconds", "Time from a request's arrival to its "
            "end (finished, failed or left by its client), for requests that were decided",
            both, buckets=E2E_BUCKETS, registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "pdd_router_prompt_tokens", "Prompt tokens of requests that got a first token",
            both, registry=r,
        )  # fmt: skip
        self.generation_tokens = Counter(
            "pdd_router_generation_tokens", "Output tokens relayed to clients", both, registry=r
        )
        self.cached_tokens = Counter(
            "pdd_router_prompt_cached_tokens", "Prompt tokens the serving engine reported as "
            "found in its prefix cache (usage.prompt_tokens_details.cached_tokens)",
            both, registry=r,
        )  # fmt: skip
        self.requests = Counter(
            "pdd_router_requests", "Generation requests that ended, by outcome: a finish reason "
            "(stop, length, tool_calls, other; abort: the client left) or an error kind "
            "(rejected by admission control, engine_busy, unavailable, invalid_request, "
            "engine_error, error; before a decision also unauthorized, forbidden, "
            "model_not_found, too_large, unprocessable)",
            [*both, "outcome"], registry=r,
        )  # fmt: skip
        self.wan_bytes = Counter(
            "pdd_router_wan_bytes", "KV bytes the served decisions sent across the WAN (the "
            "decision's predicted copy to MD)", both, registry=r,
        )  # fmt: skip
        self.in_flight = Gauge(
            "pdd_router_requests_in_flight", "Requests between their arrival and their end",
            ["model"], registry=r,
        )  # fmt: skip
        self.queued = Gauge(
            "pdd_router_requests_queued", "Requests still waiting for their first token: being "
            "decided, waiting for a busy engine, in prefill or KV transfer",
            ["model"], registry=r,
        )  # fmt: skip


class RequestMetrics:
    """One request's recorder: ``decided`` when an attempt got its first token, ``tokens``
    for each batch the client gets (tallied, added to the families every ``FLUSH_TOKENS``
    and at the end), then one end: ``finished``, ``failed`` or ``close`` (the first one
    counts; the others do nothing)."""

    def __init__(self, families: RequestFamilies, model: ResolvedModel, prompt_tokens: int) -> None:
        self._f = families
        self.model = model_label(model)
        self.prompt_tokens = prompt_tokens
        self.pipeline = NO_PIPELINE
        self.arm = "default"
        self.started = time.perf_counter()
        self._last: float | None = None  # when the previous token batch came
        self._tally: TokenTally | None = None  # over this request's children
        self._ended = False
        families.in_flight.labels(self.model).inc()
        families.queued.labels(self.model).inc()

    def decided(self, decision: Decision, arm: str | None) -> None:
        """The attempt that serves the request (its first tokens are in)."""
        self.pipeline = decision.pipeline.value
        self.arm = arm or "default"
        if decision.predicted_wan_bytes > 0:
            self._f.wan_bytes.labels(self.model, self.pipeline).inc(decision.predicted_wan_bytes)

    def tokens(self, n: int) -> None:
        """``n`` output tokens reach the client now."""
        if n <= 0 or self._ended:
            return
        now = time.perf_counter()
        if self._last is None or self._tally is None:
            f, labels = self._f, (self.model, self.pipeline)
            f.ttft.labels(*labels, self.arm).observe(now - self.started)
            f.queued.labels(self.model).dec()
            f.prompt_tokens.labels(*labels).inc(self.prompt_tokens)
            itl, generated = f.itl.labels(*labels), f.generation_tokens.labels(*labels)
            self._tally = TokenTally(itl, generated, ITL_BUCKETS)
            self._tally.add(n, None)
        else:
            self._tally.add(n, (now - self._last) / n)
        self._last = now

    def finished(self, finish_reason: str | None, cached_tokens: int | None) -> None:
        """The request ended well (no finish reason from the engine: it stopped at
        ``max_tokens``)."""
        reason = finish_reason or "length"
        if self._end(reason if reason in FINISH_REASONS else "other") and cached_tokens:
            self._f.cached_tokens.labels(self.model, self.pipeline).inc(cached_tokens)

    def failed(self, exc: BaseException) -> None:
        """The request ended on ``exc``."""
        self._end(outcome_of(exc))

    def close(self) -> None:
        """The request's last moment: one not ended otherwise was left by its client."""
        self._end("abort")

    def _end(self, outcome: str) -> bool:
        if self._ended:
            return False
        self._ended = True
        if self._tally is not None:
            self._tally.flush()
        f = self._f
        f.requests.labels(self.model, self.pipeline, outcome).inc()
        f.in_flight.labels(self.model).dec()
        if self._last is None:  # never got a token: it was still queued
            f.queued.labels(self.model).dec()
        if self.pipeline != NO_PIPELINE:
            f.e2e.labels(self.model, self.pipeline).observe(time.perf_counter() - self.started)
        return True

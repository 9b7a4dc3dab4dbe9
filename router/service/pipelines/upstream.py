"""How pipelines reach engines: each call through the pool's adapter, with metrics, a span,
the first-token and inter-token deadlines, and the circuit breakers' bookkeeping; and
what a request's execution turned out to be (``ExecutionResult``).

Every upstream call is held to deadlines (the first token within ``first_token_s``,
each next one within ``inter_token_s``) and its result reaches the pool's circuit
breakers: a failure held against the instance counts, a success clears the count; a 429
(the engine busy) is back-pressure, counted as load there, never as a fault. A call
still waiting for its first answer when the instance's breaker opens (its health probes
found it hung) gives up at once, so the request is decided again elsewhere rather than
waiting out ``first_token_s``; a stream already under way there waits at most
``ejected_grace_s`` more for its next token (one still receiving tokens goes on), then
ends with an engine error, not at ``inter_token_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from opentelemetry.trace import Tracer

from engines_adapter.contract import (
    EngineAdapter,
    EngineError,
    GenerateRequest,
    PrefillResult,
    TokenDelta,
    TokenLogprob,
)
from policies.types import Pipeline
from router.service.metrics import ServiceMetrics
from router.service.pool import InstancePool, Watch
from router.service.request_tracing import PREFILL, TRANSFER, StreamSpans

__all__ = ["ExecutionResult", "Upstream"]


@dataclass(slots=True)
class ExecutionResult:
    """What actually happened, filled in while the stream runs."""

    pipeline: Pipeline
    instances: dict[str, str] = field(default_factory=dict)
    tokens: int = 0
    eager_tokens: int = 0
    cached_tokens: int | None = None
    finish_reason: str | None = None
    handoff: str | None = None
    pipeline_change: str | None = None  # why it was served on another pipeline than decided
    # seconds spent waiting on engines before the first token: the prefill call and the
    # wait for the first token of the stream the client reads (the router's own time is
    # the rest of its time to first token)
    engine_wait_s: float = 0.0
    # the log probabilities of the tokens given out, in order, from every engine that made
    # them (RLD's, then MD's after a handoff), when the request asked for them
    logprobs: list[TokenLogprob] = field(default_factory=list)

    def given(self, delta: TokenDelta) -> list[int]:
        """The delta's token IDs for the client, counted, their log probabilities kept."""
        self.tokens += len(delta.token_ids)
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        return delta.token_ids


@dataclass(slots=True)
class Upstream:
    """How the orchestrator reaches engines: adapters, with metrics, a span, deadlines and
    the breakers' bookkeeping per call."""

    pool: InstancePool
    metrics: ServiceMetrics
    tracer: Tracer
    first_token_s: float = 30.0
    inter_token_s: float = 15.0
    ejected_grace_s: float = 1.0

    def _failed(self, instance_id: str, exc: EngineError) -> None:
        self.metrics.errors.labels(instance_id).inc()
        if exc.cause == "busy":
            self.pool.busy(instance_id)
        elif exc.held_against_instance:
            self.pool.health.failed(instance_id, unreachable=exc.cause == "unreachable")

    @staticmethod
    def _late(watch: Watch | None, what: str, limit_s: float) -> str:
        """Why a wait for an instance's answer ended."""
        if watch is not None and watch.cut:
            return f"taken out of service (its circuit breaker opened) before its {what}"
        return f"no {what} within {limit_s:g} s"

    def adapter(self, instance_id: str) -> EngineAdapter:
        self.metrics.requests.labels(instance_id).inc()
        return self.pool.get(instance_id)[1]

    async def prefill(
        self,
        instance_id: str,
        request: GenerateRequest,
        targets: int = 1,
        uncached_tokens: int | None = None,
        stage: str = PREFILL,
    ) -> PrefillResult:
        """Prefill on the instance; until it returns, its ``uncached_tokens`` (default: the
        whole prompt) count in the instance's prefill queue; ``stage``: its span's name."""
        tokens = len(request.prompt_token_ids) if uncached_tokens is None else uncached_tokens
        with self.tracer.start_as_current_span(stage) as span:
            span.set_attribute("pdd.instance", instance_id)
            span.set_attribute("pdd.prompt_tokens", len(request.prompt_token_ids))
            adapter = self.adapter(instance_id)
            self.pool.prefill_started(instance_id, tokens)
            watch = None
            try:
                async with asyncio.timeout(self.first_token_s) as deadline:
                    with self.pool.health.until_ejected(instance_id, deadline) as watch:
                        result = await adapter.prefill(request, targets=targets)
            except TimeoutError as exc:
                late = EngineError(
                    instance_id, "prefill: " + self._late(watch, "answer", self.first_token_s)
                )
                self._failed(instance_id, late)
                span.record_exception(late)
                raise late from exc
            except EngineError as exc:
                self._failed(instance_id, exc)
                span.record_exception(exc)
                raise
            finally:
                self.pool.prefill_started(instance_id, -tokens)
            self.pool.health.succeeded(instance_id)
            return result

    async def generate(
        self,
        instance_id: str,
        request: GenerateRequest,
        outcome: ExecutionResult | None,
        wait: str = TRANSFER,
    ) -> AsyncGenerator[TokenDelta, None]:
        """The engine's deltas; with ``outcome``, cached tokens and finish reason recorded;
        ``wait``: the stage its first token ends (its span's name)."""
        spans = StreamSpans(self.tracer, instance_id, wait, len(request.prompt_token_ids))
        stream = self.adapter(instance_id).generate(request)
        produced = 0
        asked = time.perf_counter()
        self.pool.stream_started(instance_id)
        try:
            while True:
                watch = None
                first = produced == 0  # waiting for the first token, a cut is at once
                wait_s = self.first_token_s if first else self.inter_token_s
                grace_s = 0.0 if first else self.ejected_grace_s
                try:
                    async with asyncio.timeout(wait_s) as deadline:
                        with self.pool.health.until_ejected(
                            instance_id, deadline, grace_s
                        ) as watch:
                            delta = await anext(stream)
                except StopAsyncIteration:
                    break
                except TimeoutError as exc:
                    what = "first token" if first else f"token after {produced}"
                    late = self._late(watch, what, wait_s)
                    raise EngineError(instance_id, "generate: " + late) from exc
                if produced == 0 and delta.token_ids:
                    self.pool.health.succeeded(instance_id)
                    spans.first_token()
                    if outcome is not None and outcome.tokens == 0:  # the client's first
                        outcome.engine_wait_s += time.perf_counter() - asked
                produced += len(delta.token_ids)
                if outcome is not None:
                    if delta.cached_tokens is not None and outcome.cached_tokens is None:
                        outcome.cached_tokens = delta.cached_tokens
                    if delta.finished:
                        outcome.finish_reason = delta.finish_reason
                yield delta
        except EngineError as exc:
            self._failed(instance_id, exc)
            spans.failed(exc)
            raise
        finally:
            self.pool.stream_started(instance_id, -1)
            await stream.aclose()
            spans.end(produced)

"""Execute a Decision through the engine adapters: P-MD, P-RLD-MD with handoff, P-RLD.

The handoff is extend-decode by token IDs: MD receives the prompt plus the eager
tokens RLD already streamed and continues from there, so the client's token
sequence has no gap and no repeat. One-shot switches as soon as MD is ready;
catch-up first warms MD with chunks of eager tokens while RLD keeps decoding and
switches once fewer than a chunk remain. If MD fails before the switch, RLD, which was
asked for the whole generation, finishes the request (it degrades to P-RLD).

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
import contextlib
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Tracer

from engines_adapter.contract import (
    EngineAdapter,
    EngineError,
    GenerateRequest,
    PrefillResult,
    TokenDelta,
    TokenLogprob,
)
from policies.tiers import Tier
from policies.types import Decision, HandoffMode, Pipeline
from router.service.metrics import ServiceMetrics
from router.service.pool import InstancePool, Watch

__all__ = ["ExecutionResult", "Upstream", "execute"]


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
            self.pool.failed(instance_id, unreachable=exc.cause == "unreachable")

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
    ) -> PrefillResult:
        """Prefill on the instance; until it returns, its ``uncached_tokens`` (default: the
        whole prompt) count in the instance's prefill queue."""
        tokens = len(request.prompt_token_ids) if uncached_tokens is None else uncached_tokens
        with self.tracer.start_as_current_span("pdd.upstream.prefill") as span:
            span.set_attribute("pdd.instance", instance_id)
            span.set_attribute("pdd.prompt_tokens", len(request.prompt_token_ids))
            adapter = self.adapter(instance_id)
            self.pool.prefill_started(instance_id, tokens)
            watch = None
            try:
                async with asyncio.timeout(self.first_token_s) as deadline:
                    with self.pool.until_ejected(instance_id, deadline) as watch:
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
            self.pool.succeeded(instance_id)
            return result

    async def generate(
        self, instance_id: str, request: GenerateRequest, outcome: ExecutionResult | None
    ) -> AsyncGenerator[TokenDelta, None]:
        """The engine's deltas; with ``outcome``, cached tokens and finish reason recorded."""
        span = self.tracer.start_span("pdd.upstream.generate")
        span.set_attribute("pdd.instance", instance_id)
        span.set_attribute("pdd.prompt_tokens", len(request.prompt_token_ids))
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
                        with self.pool.until_ejected(instance_id, deadline, grace_s) as watch:
                            delta = await anext(stream)
                except StopAsyncIteration:
                    break
                except TimeoutError as exc:
                    what = "first token" if first else f"token after {produced}"
                    late = self._late(watch, what, wait_s)
                    raise EngineError(instance_id, "generate: " + late) from exc
                if produced == 0 and delta.token_ids:
                    self.pool.succeeded(instance_id)
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
            span.record_exception(exc)
            raise
        finally:
            self.pool.stream_started(instance_id, -1)
            await stream.aclose()
            span.set_attribute("pdd.tokens", produced)
            span.end()


async def _colocated(
    up: Upstream, decision: Decision, req: GenerateRequest, outcome: ExecutionResult
) -> AsyncGenerator[list[int], None]:
    """The whole request on one engine; its uncached prompt counts in the engine's prefill
    queue until the first token (what the colocated policy weighs)."""
    engine, prompt = decision.p_instance, req.prompt_token_ids
    uncached = max(len(prompt) - round(decision.predicted_hit.get(Tier.P, 0.0) * len(prompt)), 1)
    up.pool.prefill_started(engine, uncached)
    queued = True
    try:
        async with contextlib.aclosing(up.generate(engine, req, outcome)) as deltas:
            async for delta in deltas:
                if queued and delta.token_ids:
                    up.pool.prefill_started(engine, -uncached)
                    queued = False
                outcome.tokens += len(delta.token_ids)
                yield _given(outcome, delta)
    finally:
        if queued:
            up.pool.prefill_started(engine, -uncached)


async def execute(
    up: Upstream, decision: Decision, client: GenerateRequest, outcome: ExecutionResult
) -> AsyncGenerator[list[int], None]:
    """Yield token-ID lists as ``client`` (the whole generation the client asked for: prompt,
    max_tokens, sampling) decodes along ``decision``; raise EngineError on an engine fault.

    Every engine call derives from ``client``, so sampling settings such as ``ignore_eos``
    hold on every tier and across the handoff."""
    request_id, prompt, max_tokens = client.request_id, client.prompt_token_ids, client.max_tokens

    def derived(**update: Any) -> GenerateRequest:
        return client.model_copy(update=update)

    outcome.instances["p"] = decision.p_instance
    if decision.pipeline is Pipeline.COLOCATED:  # one engine prefills and decodes
        async for ids in _colocated(up, decision, derived(request_id=f"{request_id}-p"), outcome):
            yield ids
        return
    pre = derived(request_id=f"{request_id}-p", max_tokens=1)
    targets = 2 if decision.pipeline is Pipeline.P_RLD_MD else 1
    hit = decision.predicted_hit.get(Tier.P, 0.0)
    uncached = max(len(prompt) - round(hit * len(prompt)), 1)
    asked = time.perf_counter()
    prefill = await up.prefill(decision.p_instance, pre, targets, uncached)
    outcome.engine_wait_s += time.perf_counter() - asked
    kv = prefill.params_for(0)  # the first target: MD for P-MD, RLD otherwise
    kv_md = prefill.params_for(1) if targets == 2 else None

    if decision.pipeline is Pipeline.P_MD:
        assert decision.md_instance is not None
        outcome.instances["md"] = decision.md_instance
        req = derived(kv_transfer_params=kv)
        async with contextlib.aclosing(up.generate(decision.md_instance, req, outcome)) as deltas:
            async for delta in deltas:
                outcome.tokens += len(delta.token_ids)
                yield _given(outcome, delta)
        return

    assert decision.rld_instance is not None
    outcome.instances["rld"] = decision.rld_instance
    rld_id = decision.rld_instance
    rld_req = derived(request_id=f"{request_id}-rld", kv_transfer_params=kv)
    if decision.pipeline is Pipeline.P_RLD:
        async with contextlib.aclosing(up.generate(rld_id, rld_req, outcome)) as deltas:
            async for delta in deltas:
                outcome.tokens += len(delta.token_ids)
                outcome.eager_tokens += len(delta.token_ids)
                yield _given(outcome, delta)
        return

    assert decision.md_instance is not None
    assert decision.handoff is not None
    md_id = decision.md_instance
    eager: list[int] = []
    rld_stream = up.generate(rld_id, rld_req, None)
    asked = time.perf_counter()
    md_ready = asyncio.create_task(_warm(up, md_id, derived(request_id=f"{request_id}-md0"), kv_md))
    chunk = decision.chunk_tokens or 64
    warming: asyncio.Task[None] | None = None
    handed = 0
    md_fault: EngineError | None = None  # MD failed before the switch: RLD goes on
    try:
        async for delta in rld_stream:
            if delta.token_ids:
                if not eager:  # RLD's first token, the client's first
                    outcome.engine_wait_s += time.perf_counter() - asked
                eager.extend(delta.token_ids)
                outcome.tokens += len(delta.token_ids)
                yield _given(outcome, delta)
            if delta.finished:
                # RLD finished before the handoff: the request ends on RLD (odd traffic, or
                # MD lost on the way)
                outcome.pipeline = Pipeline.P_RLD
                outcome.finish_reason = delta.finish_reason
                outcome.eager_tokens = len(eager)
                outcome.pipeline_change = (
                    f"MD {md_id} failed before the handoff ({md_fault.public}); RLD finished"
                    if md_fault is not None
                    else f"RLD finished before MD {md_id} was ready"
                )
                return
            if md_fault is not None or not md_ready.done():
                continue
            md_fault = _fault_of(md_ready) or (
                _fault_of(warming) if warming is not None and warming.done() else None
            )
            if md_fault is not None:
                continue
            if decision.handoff is HandoffMode.CATCH_UP and len(eager) - handed >= chunk:
                if warming is None or warming.done():
                    handed = len(eager)
                    warming = asyncio.create_task(
                        _warm(
                            up,
                            md_id,
                            derived(
                                request_id=f"{request_id}-md{handed}",
                                prompt_token_ids=prompt + eager[:handed],
                            ),
                        )
                    )
                continue
            if warming is not None and not warming.done():
                continue
            break  # switch to MD now
    finally:
        aclose = getattr(rld_stream, "aclose", None)
        if aclose is not None:
            await aclose()
        with contextlib.suppress(EngineError, KeyError):  # KeyError: RLD was removed
            await up.pool.get(rld_id)[1].abort(rld_req.request_id)
        for task in (md_ready, warming):
            if task is not None and not task.done():
                task.cancel()
    if md_fault is not None:  # RLD's stream ended without finishing, and MD is lost
        raise md_fault
    # RLD's stream ended without finishing and MD never got ready: wait for MD
    if not md_ready.done() or md_ready.cancelled():
        await _warm(up, md_id, derived(request_id=f"{request_id}-md0"), kv_md)
    if not eager:  # RLD gave the client nothing: all of it was a wait on engines
        outcome.engine_wait_s += time.perf_counter() - asked
    outcome.eager_tokens = len(eager)
    outcome.handoff = decision.handoff.value
    up.metrics.handoffs.labels(decision.handoff.value).inc()
    outcome.instances["md"] = md_id
    rest = max_tokens - len(eager)
    if rest <= 0:
        outcome.finish_reason = "length"
        return
    ext = derived(prompt_token_ids=prompt + eager, max_tokens=rest)
    async with contextlib.aclosing(up.generate(md_id, ext, outcome)) as deltas:
        async for delta in deltas:
            outcome.tokens += len(delta.token_ids)
            yield _given(outcome, delta)


def _given(outcome: ExecutionResult, delta: TokenDelta) -> list[int]:
    """The delta's token IDs for the client, their log probabilities kept in ``outcome``."""
    if delta.logprobs:
        outcome.logprobs.extend(delta.logprobs)
    return delta.token_ids


def _fault_of(task: asyncio.Task[None]) -> EngineError | None:
    """A finished task's engine fault (other exceptions are bugs: raised)."""
    exc = task.exception()
    if exc is None or isinstance(exc, EngineError):
        return exc
    raise exc


async def _warm(
    up: Upstream, md_id: str, request: GenerateRequest, kv: dict[str, Any] | None = None
) -> None:
    """Make MD hold the prompt's KV (its copy arriving; on CPU engines, computing it)."""
    await up.prefill(md_id, request.model_copy(update={"max_tokens": 1, "kv_transfer_params": kv}))

"""One generation through the cluster, as every OpenAI endpoint runs it: hash the prompt's
token IDs, decide, execute with fail-over until the first token, then stream or collect
the rest; the outcome is recorded when it ends.

The endpoints (``api.py`` for completions, ``openai_api.py`` for chat) only turn a
request into a ``Job`` and the tokens into their response format.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import structlog
from fastapi import Request

from engines_adapter.contract import EngineError, GenerateRequest, StructuredOutput, TokenLogprob
from policies.tiers import Tier
from policies.types import Decision, RequestView
from router.hashing import HashExtras, chain_hashes
from router.service.errors import ApiError
from router.service.experiments import Arm
from router.service.models import ResolvedModel
from router.service.orchestrator import ExecutionResult, execute
from router.service.outcomes import Timing
from router.service.parts import GenerationDeps
from router.service.request_metrics import RequestMetrics
from router.service.tenancy import PREDICTION_FIELDS, shows_predictions
from router.service.text_stream import TextStream

__all__ = [
    "ClientGone",
    "Generation",
    "Job",
    "out_of_vocabulary",
    "served",
    "stream_error",
]

MAX_ATTEMPTS = 3
DISCONNECT_POLL_S = 0.2
"""How often a request waiting on engines checks that its client is still there."""
log = structlog.get_logger("pdd_router.service")
T = TypeVar("T")


class ClientGone(Exception):
    """The client closed the connection while its request ran; the engines were told."""


def as_list(ids: Sequence[int]) -> list[int]:
    """Token IDs as the list an engine request carries (``array.tolist`` runs in C)."""
    if isinstance(ids, list):
        return ids
    return ids.tolist() if isinstance(ids, array) else list(ids)


@dataclass(slots=True)
class Job:
    """What to generate: the prompt's token IDs (exactly what the engines get and the
    router hashes), how much, how to sample, and for whom."""

    prompt: Sequence[int]  # a list, or the array('i') a chat encode with a cached prefix gives
    max_tokens: int
    model: ResolvedModel
    temperature: float = 0.0
    ignore_eos: bool = False
    sampling: dict[str, Any] = field(default_factory=dict)
    session_id: str | None = None
    extras: HashExtras | None = None
    vocab_end: int | None = None  # token IDs an engine sends must be below it
    logprobs: int | None = None  # alternatives per token asked of the engines (None: none)
    structured: StructuredOutput | None = None  # output constrained to JSON


class Generation:
    """A started request: decided and executed up to its first tokens."""

    def __init__(
        self,
        deps: GenerationDeps,
        job: Job,
        view: RequestView,
        decision: Decision,
        arm: Arm | None,
        outcome: ExecutionResult,
        stream: Any,
        first: list[int] | None,
        timing: Timing,
        metrics: RequestMetrics,
    ) -> None:
        self.svc, self.job, self.view = deps, job, view  # svc: the generation's parts
        self.metrics = metrics
        self.decision, self.arm, self.outcome = decision, arm, outcome
        self._stream = stream
        self._first = first
        self.timing = timing
        self.request_id = view.request_id or ""
        self.recorded = False
        self._logprobs_taken = 0

    @classmethod
    async def start(cls, deps: GenerationDeps, request: Request, job: Job) -> Generation:
        """Decide and execute until the first token, deciding again without an instance
        that failed (its breaker counts it); ApiError for what the client must be told."""
        chain = chain_hashes(job.prompt, deps.block_size, deps.hash_seed,
                             extras=job.extras)  # fmt: skip
        request_id = deps.ids.next()
        view = RequestView(chain.hashes, chain.block_size, chain.num_tokens, job.max_tokens,
                           job.session_id, time.time(), request_id)  # fmt: skip
        timing = Timing(time.perf_counter())
        metrics = RequestMetrics(deps.requests, job.model, len(job.prompt))
        client = GenerateRequest(
            request_id=request_id, prompt_token_ids=as_list(job.prompt), max_tokens=job.max_tokens,
            temperature=job.temperature, ignore_eos=job.ignore_eos, sampling=job.sampling,
            logprobs=job.logprobs, structured=job.structured,
        )  # fmt: skip
        failed: set[str] = set()
        busy: set[str] = set()  # answered 429 to this request: elsewhere, or a bit later
        waited = 0.0  # failed attempts' time: spent on engines, not the router's own
        with deps.outcomes.unwatched_on_error(request_id):
            try:  # what the decision claimed counts until the first token
                for attempt in range(MAX_ATTEMPTS):
                    decision, arm = await deps.decider.decide_around(
                        view, failed, busy, job.model.instances_of
                    )
                    deps.outcomes.watch(view, decision)
                    outcome = ExecutionResult(decision.pipeline, engine_wait_s=waited)
                    stream = execute(deps.upstream, decision, client, outcome)
                    tried = time.perf_counter()
                    try:
                        first = await _unless_client_leaves(request, anext(stream, None))
                        metrics.decided(decision, arm.spec.name if arm is not None else None)
                        return cls(deps, job, view, decision, arm, outcome, stream, first, timing,
                                   metrics)  # fmt: skip
                    except ClientGone:
                        raise ApiError(499, "the client closed the connection") from None
                    except EngineError as exc:
                        waited += time.perf_counter() - tried
                        await stream.aclose()
                        if exc.cause == "request":
                            raise refused(exc) from exc
                        log.warning("engine failed before the first token", request=request_id,
                                    attempt=attempt + 1, error=str(exc))  # fmt: skip
                        (busy if exc.cause == "busy" else failed).add(exc.instance_id)
                        if attempt == MAX_ATTEMPTS - 1:
                            raise _unserved(exc) from exc
            except BaseException as exc:
                metrics.failed(exc)
                raise
            finally:
                deps.pool.release(request_id)
        raise AssertionError("unreachable")  # pragma: no cover

    async def deltas(self) -> AsyncIterator[list[int]]:
        """The token IDs as they come (the first ones included); EngineError mid-stream."""
        pending = self._first
        self._first = None
        while pending is not None:
            bad = out_of_vocabulary(pending, self.job.vocab_end)
            if bad is not None:
                instance = self.decision.md_instance or self.decision.rld_instance or "engine"
                raise EngineError(instance, f"sent token id {bad!r}, outside the vocabulary "
                                  f"[0, {self.job.vocab_end})")  # fmt: skip
            self.timing.saw(len(pending))
            self.metrics.tokens(len(pending))
            yield pending
            pending = await anext(self._stream, None)

    async def until_stopped(self, request: Request, text: TextStream) -> AsyncIterator[list[int]]:
        """Every token ID batch and its text, until the end or a stop string; waits only
        while the client stays (ApiError if it leaves or the engine fails)."""

        async def gather() -> list[list[int]]:
            batches = []
            async for delta_ids in self.deltas():
                _, ids = await text.take(delta_ids)
                batches.append(ids)
                if text.stopped:
                    break
            await text.flush()
            return batches

        with self.svc.outcomes.unwatched_on_error(self.request_id):
            try:
                for batch in await _unless_client_leaves(request, gather()):
                    yield batch
            except ClientGone:
                raise ApiError(499, "the client closed the connection") from None
            except EngineError as exc:
                self.metrics.failed(exc)
                if exc.cause == "request":
                    raise refused(exc) from exc
                log.warning("engine failed mid-request", request=self.request_id,
                            error=str(exc))  # fmt: skip
                raise ApiError(
                    502, f"engine failed mid-request: {exc.public}", type_="upstream_error"
                ) from exc

    def take_logprobs(self, count: int) -> list[TokenLogprob]:
        """The log probabilities of the next ``count`` tokens given out (from whichever
        engines made them; empty when the request asked for none)."""
        start = self._logprobs_taken
        self._logprobs_taken += count
        return self.outcome.logprobs[start : start + count]

    def finish(self, *, stopped: bool = False) -> None:
        """The request ended well: record its outcome (history, metrics, decision log);
        ``stopped``: a stop string ended it."""
        if stopped:
            self.outcome.finish_reason = "stop"
        self.metrics.finished(self.outcome.finish_reason, self.outcome.cached_tokens)
        if not self.recorded:
            self.recorded = True
            self.svc.outcomes.record(self.view, self.decision, self.outcome, self.arm,
                                     self.timing)  # fmt: skip

    async def close(self) -> None:
        """Stop the engines' work (a client that left, a stop string); an unrecorded
        request stops being watched."""
        with anyio.CancelScope(shield=True):
            await self._stream.aclose()
        self.metrics.close()
        if not self.recorded:
            self.svc.outcomes.unwatch(self.request_id)

    def cached_tokens(self) -> tuple[int, str]:
        """Prompt tokens found in cache, and where that figure comes from: the engine's
        report, else the router's prediction for the tier that served."""
        if self.outcome.cached_tokens is not None:
            return self.outcome.cached_tokens, "engine"
        if not self.shows_predictions():
            return 0, "none"
        tier = Tier.MD if "md" in self.outcome.instances else Tier.RLD
        if tier.value not in self.outcome.instances:
            tier = Tier.P
        hit = self.decision.predicted_hit.get(tier, 0.0)
        return round(hit * len(self.job.prompt)), "predicted"

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        cached, _ = self.cached_tokens()
        prompt = len(self.job.prompt)
        return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                "total_tokens": prompt + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip

    def shows_predictions(self) -> bool:
        """Whether the client may see the router's predictions (``tenancy``)."""
        salt = self.job.extras.cache_salt if self.job.extras is not None else None
        return shows_predictions(self.svc.service, salt)

    def served(self) -> dict[str, object]:
        """What served the request, for the response's ``pdd`` field (the predictions
        only when the client may see them)."""
        shown = served(self.decision, self.outcome)
        if not self.shows_predictions():
            shown = {k: v for k, v in shown.items() if k not in PREDICTION_FIELDS}
        return {**shown, "cached_tokens_source": self.cached_tokens()[1]}

    def headers(self) -> dict[str, str]:
        """The ``x-pdd-*`` headers of the response (the decision's reason only when the
        client may see predictions)."""
        headers = {"x-pdd-pipeline": self.decision.pipeline.value}
        if self.shows_predictions():
            headers["x-pdd-decision"] = self.decision.reason
        headers["x-pdd-request-id"] = self.request_id
        return headers


def _unserved(exc: EngineError) -> ApiError:
    """What the client is told when its last attempt failed too."""
    if exc.cause == "busy":
        return ApiError(429, f"the engines are at capacity: {exc.public}; retry later",
                        type_="rate_limit_exceeded", code="engine_busy",
                        headers={"Retry-After": "1"})  # fmt: skip
    return ApiError(503, f"no engine could serve the request: {exc.public}",
                    type_="service_unavailable", headers={"Retry-After": "1"})  # fmt: skip


def served(decision: Decision, outcome: ExecutionResult) -> dict[str, object]:
    return {
        "pipeline": outcome.pipeline.value,
        "decided_pipeline": decision.pipeline.value,
        "instances": outcome.instances,
        "handoff": outcome.handoff,
        "pipeline_change": outcome.pipeline_change,
        "eager_tokens": outcome.eager_tokens,
        "predicted_hit": {t.value: h for t, h in decision.predicted_hit.items()},
        "reason": decision.reason,
    }


def refused(exc: EngineError) -> ApiError:
    """An engine refused the request itself: the client's error, in the engine's words."""
    return ApiError(400, exc.public, param="prompt")


def out_of_vocabulary(ids: Sequence[int], vocab_end: int | None) -> object | None:
    """The first token ID of an engine's answer that is not an int in [0, ``vocab_end``)
    (any int >= 0 without a bound), or None when all are."""
    if not ids:
        return None
    ints = all(type(t) is int for t in ids)  # min and max run in C; the scan only on error
    if ints and min(ids) >= 0 and (vocab_end is None or max(ids) < vocab_end):
        return None
    for token in ids:
        wrong = type(token) is not int or token < 0
        if wrong or (vocab_end is not None and token >= vocab_end):
            return token
    return None


def stream_error(exc: EngineError) -> tuple[str, str, int]:
    """The message, type and status of an error event for a stream that broke."""
    status, kind = (
        (400, "invalid_request_error") if exc.cause == "request" else (502, "upstream_error")
    )
    return f"engine failed mid-stream: {exc.public}", kind, status


async def _unless_client_leaves(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result, or ClientGone once the client has closed the connection (``work``
    is then cancelled, which closes its engine streams: engines abort such requests)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone
    finally:
        if not task.done():
            task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait({task})

"""The request path: POST /v1/route (decide) and POST /v1/completions (decide and execute)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Collection
from typing import TypeVar

import anyio
import numpy as np
import numpy.typing as npt
import structlog
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from pydantic import ValidationError

from engines_adapter.contract import EngineError, GenerateRequest
from policies.types import Decision, RequestView
from router.hashing import chain_hashes
from router.service.errors import ApiError, error_body
from router.service.experiments import Arm
from router.service.orchestrator import ExecutionResult, Upstream, execute
from router.service.outcomes import Timing, record_outcome, unwatch, unwatched_on_error, watch
from router.service.route_body import FastRouteBody, decode_route_body
from router.service.schemas import (
    ERROR_RESPONSES,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    RouteRequest,
    Usage,
    input_limits,
)
from router.service.state import ServiceState

__all__ = ["api_router", "decide_route"]

api_router = APIRouter(responses=ERROR_RESPONSES(400, 413, 422, 503))
MAX_ATTEMPTS = 3
DISCONNECT_POLL_S = 0.2
"""How often a request waiting on engines checks that its client is still there."""
log = structlog.get_logger("pdd_router.service")
T = TypeVar("T")


class ClientGone(Exception):
    """The client closed the connection while its request ran; the engines were told."""


def _state(request: Request) -> ServiceState:
    state: ServiceState = request.state.svc
    return state


def _check_prompt(svc: ServiceState, tokens: list[int] | npt.NDArray[np.int64], field: str) -> None:
    limit = svc.settings.service.max_prompt_tokens
    if len(tokens) > limit:
        raise ApiError(400, f"{field} has {len(tokens)} tokens, over the limit of {limit}",
                       param=field)  # fmt: skip
    vocab = svc.settings.service.vocab_size
    if len(tokens) == 0:
        return
    # min/max run in C; the Python scan that names the token runs only on the error path
    if isinstance(tokens, np.ndarray):
        low, high = int(tokens.min()), int(tokens.max())
    else:
        low, high = min(tokens), max(tokens)
    if low >= 0 and (vocab is None or high < vocab):
        return
    bad = next((int(t) for t in tokens if t < 0 or (vocab is not None and t >= vocab)), None)
    if bad is not None:
        bound = f"[0, {vocab})" if vocab is not None else "non-negative"
        raise ApiError(400, f"{field} holds token id {bad}, outside {bound}", param=field)


async def _decide(
    svc: ServiceState, view: RequestView, exclude: Collection[str] = ()
) -> tuple[Decision, Arm | None]:
    """Decide with the running experiment's arm for this request, or the default policy;
    ``exclude``: instances this request already failed on."""
    start = time.perf_counter()
    svc.pool.view.now = time.time()  # the decision log's ``t``
    experiment = svc.experiments.running()
    arm = experiment.assign(view) if experiment is not None else None
    scheduler = arm.scheduler if arm is not None else svc.scheduler
    with svc.tracer.start_as_current_span("pdd.decide") as span:
        try:
            decision = await svc.lane.run(scheduler.decide, view, svc.pool.view_without(exclude))
        except LookupError as exc:
            raise ApiError(503, f"cannot route: {exc}", type_="service_unavailable",
                           headers={"Retry-After": "1"}) from exc  # fmt: skip
        span.set_attribute("pdd.pipeline", decision.pipeline.value)
        span.set_attribute("pdd.p_instance", decision.p_instance)
        span.set_attribute("pdd.md_instance", decision.md_instance or "")
        span.set_attribute("pdd.rld_instance", decision.rld_instance or "")
        span.set_attribute("pdd.arm", arm.spec.name if arm is not None else "default")
    svc.metrics.decision_latency.observe(time.perf_counter() - start)
    handoff = decision.handoff.value if decision.handoff else "none"
    arm_name = arm.spec.name if arm is not None else "default"
    svc.metrics.decisions.labels(decision.pipeline.value, handoff, arm_name).inc()
    return decision, arm


_ROUTE_BODY = {
    "required": True,
    "content": {"application/json": {"schema": RouteRequest.model_json_schema()}},
}


def _route_body(body: bytes) -> FastRouteBody | RouteRequest:
    """The route request: decoded fast when valid, else validated by ``RouteRequest``
    (whose errors name the bad field: 422, or 400 for a value over a limit)."""
    fast = decode_route_body(body, input_limits())
    if fast is not None:
        return fast
    try:
        return RouteRequest.model_validate_json(body)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None


@api_router.post(
    "/v1/route",
    response_model=Decision,
    tags=["routing"],
    openapi_extra={"requestBody": _ROUTE_BODY},
)
async def route(request: Request) -> Decision:
    """Decide a request without executing it (the body is a ``RouteRequest``: token IDs, or
    a trace's block IDs with their block size)."""
    return await decide_route(_state(request), _route_body(await request.body()))


async def decide_route(svc: ServiceState, body: FastRouteBody | RouteRequest) -> Decision:
    """The decision for a route request (ApiError for a prompt the service refuses, or no
    instance to route to)."""
    if body.token_ids is not None:
        _check_prompt(svc, body.token_ids, "token_ids")
        chain = chain_hashes(body.token_ids, svc.settings.block_size, svc.settings.hash_seed)
        view = RequestView(chain.hashes, chain.block_size, chain.num_tokens, body.max_tokens,
                           body.session_id, time.time(), svc.next_request_id())  # fmt: skip
    else:
        assert body.hash_ids is not None
        assert body.block_size is not None
        length = body.input_length or len(body.hash_ids) * body.block_size
        view = RequestView(tuple(body.hash_ids), body.block_size, length, body.max_tokens,
                           body.session_id, time.time(), svc.next_request_id())  # fmt: skip
    return (await _decide(svc, view))[0]


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


def _upstream(svc: ServiceState) -> Upstream:
    service = svc.settings.service
    return Upstream(svc.pool, svc.metrics, svc.tracer, first_token_s=service.engine_timeout_s,
                    inter_token_s=service.engine_inter_token_timeout_s)  # fmt: skip


def _refused(exc: EngineError) -> ApiError:
    """An engine refused the request itself: the client's error, in the engine's words."""
    return ApiError(400, exc.public, param="prompt")


async def _collect(stream: AsyncIterator[list[int]], first: list[int] | None,
                   timing: Timing) -> list[int]:  # fmt: skip
    tokens = list(first or [])
    timing.saw(len(tokens))
    async for ids in stream:
        tokens.extend(ids)
        timing.saw(len(ids))
    return tokens


@api_router.post(
    "/v1/completions",
    tags=["openai"],
    response_model=CompletionResponse,
    responses={
        **ERROR_RESPONSES(502),
        200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE when streaming"},
    },
)
async def completions(body: CompletionRequest, request: Request) -> object:
    """OpenAI-compatible completion with token IDs: decides, then executes the decision."""
    svc = _state(request)
    _check_prompt(svc, body.prompt, "prompt")
    max_tokens = body.max_tokens or svc.settings.service.max_tokens_default
    if max_tokens > svc.settings.service.max_tokens_limit:
        limit = svc.settings.service.max_tokens_limit
        raise ApiError(400, f"max_tokens {max_tokens} is over the limit of {limit}",
                       param="max_tokens")  # fmt: skip
    chain = chain_hashes(body.prompt, svc.settings.block_size, svc.settings.hash_seed)
    request_id = svc.next_request_id()
    view = RequestView(chain.hashes, chain.block_size, chain.num_tokens, body.max_tokens,
                       body.session_id or body.user, time.time(), request_id)  # fmt: skip
    timing = Timing(time.perf_counter())
    generation = GenerateRequest(
        request_id=request_id, prompt_token_ids=body.prompt, max_tokens=max_tokens,
        temperature=body.temperature, ignore_eos=body.ignore_eos,
    )  # fmt: skip

    # Fail over until the first token: an instance that failed is left out and the request
    # decided again; its breaker counts the failure. A refusal is the client's error.
    failed: set[str] = set()
    with unwatched_on_error(svc, request_id):
        for attempt in range(MAX_ATTEMPTS):
            decision, arm = await _decide(svc, view, failed)
            watch(svc, view, decision)
            outcome = ExecutionResult(decision.pipeline)
            stream = execute(_upstream(svc), decision, generation, outcome)
            try:
                first = await _unless_client_leaves(request, anext(stream, None))
                break
            except ClientGone:
                raise ApiError(499, "the client closed the connection") from None
            except EngineError as exc:
                await stream.aclose()
                if exc.cause == "request":
                    raise _refused(exc) from exc
                log.warning("engine failed before the first token", request=request_id,
                            attempt=attempt + 1, error=str(exc))  # fmt: skip
                failed.add(exc.instance_id)
                if attempt == MAX_ATTEMPTS - 1:
                    raise ApiError(503, f"no engine could serve the request: {exc.public}",
                                   type_="service_unavailable",
                                   headers={"Retry-After": "1"}) from exc  # fmt: skip

    created = int(time.time())
    model = body.model or "pdd-router"
    if not body.stream:
        with unwatched_on_error(svc, request_id):
            try:
                tokens = await _unless_client_leaves(request, _collect(stream, first, timing))
            except ClientGone:
                raise ApiError(499, "the client closed the connection") from None
            except EngineError as exc:
                if exc.cause == "request":
                    raise _refused(exc) from exc
                log.warning("engine failed mid-request", request=request_id, error=str(exc))
                raise ApiError(
                    502, f"engine failed mid-request: {exc.public}", type_="upstream_error"
                ) from exc
        record_outcome(svc, view, decision, outcome, arm, timing)
        return CompletionResponse(
            id=request_id, created=created, model=model,
            choices=[CompletionChoice(token_ids=tokens, finish_reason=outcome.finish_reason)],
            usage=_usage(len(body.prompt), len(tokens), outcome),
            pdd=_served(decision, outcome),
        )  # fmt: skip

    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    async def sse() -> AsyncIterator[str]:
        recorded = False
        try:
            sent = 0
            chunk = {"id": request_id, "object": "text_completion", "created": created,
                     "model": model}  # fmt: skip
            try:
                pending = first
                while pending is not None:
                    sent += len(pending)
                    timing.saw(len(pending))
                    choice = {"index": 0, "text": "", "token_ids": pending, "finish_reason": None}
                    yield _data({**chunk, "choices": [choice]})
                    pending = await anext(stream, None)
            except EngineError as exc:
                log.warning("engine failed mid-stream", request=request_id, error=str(exc))
                status, kind = (
                    (400, "invalid_request_error")
                    if exc.cause == "request"
                    else (502, "upstream_error")
                )
                yield _data(error_body(f"engine failed mid-stream: {exc.public}", kind, None,
                                       status))  # fmt: skip
                yield "data: [DONE]\n\n"
                return
            record_outcome(svc, view, decision, outcome, arm, timing)
            recorded = True
            final = {"index": 0, "text": "", "token_ids": [],
                     "finish_reason": outcome.finish_reason or "length"}  # fmt: skip
            yield _data({**chunk, "choices": [final], "pdd": _served(decision, outcome)})
            if include_usage:
                usage = _usage(len(body.prompt), sent, outcome).model_dump()
                yield _data({**chunk, "choices": [], "usage": usage})
            yield "data: [DONE]\n\n"
        finally:  # a failed or dropped stream writes no outcome: stop watching it
            with anyio.CancelScope(shield=True):  # a client that left: engines abort
                await stream.aclose()
            if not recorded:
                unwatch(svc, request_id)

    headers = {"x-pdd-pipeline": decision.pipeline.value, "x-pdd-decision": decision.reason}
    return StreamingResponse(sse(), media_type="text/event-stream", headers=headers)


def _data(obj: object) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def _usage(prompt: int, completion: int, outcome: ExecutionResult) -> Usage:
    details = None if outcome.cached_tokens is None else {"cached_tokens": outcome.cached_tokens}
    return Usage(prompt_tokens=prompt, completion_tokens=completion,
                 total_tokens=prompt + completion, prompt_tokens_details=details)  # fmt: skip


def _served(decision: Decision, outcome: ExecutionResult) -> dict[str, object]:
    return {
        "pipeline": outcome.pipeline.value,
        "decided_pipeline": decision.pipeline.value,
        "instances": outcome.instances,
        "handoff": outcome.handoff,
        "eager_tokens": outcome.eager_tokens,
        "predicted_hit": {t.value: h for t, h in decision.predicted_hit.items()},
        "reason": decision.reason,
    }

"""The simulated engine behind an HTTP server speaking the vLLM subset the router uses.

``POST /v1/completions`` (token-ID prompts, streaming SSE or one JSON, usage with
``prompt_tokens_details.cached_tokens``, ``kv_transfer_params`` for P/D), ``GET
/health``, ``GET /metrics`` (vLLM's metric names), ``GET /v1/models``, ``POST
/reset_prefix_cache``, KV events over ZMQ PUB in vLLM's wire format, and ``/sim/faults``
to inject faults (``busy_next``: the next completions are answered 429). Closing a
streamed response aborts the generation. The app comes from a factory; the engine and
the publisher live in the lifespan state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypedDict, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from pydantic import BaseModel, ConfigDict, Field

from engine_sim.engine import SimEngine, SimEngineConfig, SimFaults
from engine_sim.metrics import SimEngineCollector, render_metrics
from engines_adapter.contract import (
    EngineError,
    GenerateRequest,
    StructuredOutput,
    TokenDelta,
    TokenLogprob,
)
from engines_adapter.kv_events import WireForm
from engines_adapter.kv_publisher import KVEventPublisher

__all__ = ["CompletionBody", "SimServerConfig", "create_app"]


class SimServerConfig(BaseModel):
    """One simulated engine server."""

    model_config = ConfigDict(extra="forbid")

    instance_id: str = "sim-0"
    model_name: str = "pdd-sim"
    max_model_len: int = 32_768
    engine: SimEngineConfig = Field(default_factory=SimEngineConfig)
    kv_events_endpoint: str | None = None  # e.g. tcp://*:5557 (bind)
    kv_replay_endpoint: str | None = None  # e.g. tcp://*:5558 (bind)
    kv_events_form: WireForm = "map"


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class CompletionBody(BaseModel):
    """The fields of vLLM's completion request the simulated engine honours (others ignored)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: list[int] | list[list[int]] | str
    max_tokens: int | None = Field(16, ge=1)
    temperature: float | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = None
    kv_transfer_params: dict[str, Any] | None = None
    request_id: str | None = None
    cache_salt: str | None = None
    logprobs: int | None = Field(None, ge=0)
    response_format: dict[str, Any] | None = None


class _State(TypedDict):
    engine: SimEngine
    publisher: KVEventPublisher | None
    registry: CollectorRegistry


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": status}},
        status_code=status,
    )


def _engine_error(exc: EngineError) -> JSONResponse:
    if exc.retryable:
        return _error(503, str(exc), "ServiceUnavailableError")
    return _error(400, str(exc), "BadRequestError")


def _structured(response_format: dict[str, Any] | None) -> StructuredOutput | None:
    """vLLM's ``response_format`` as the engine's structured output (``text``: none)."""
    kind = (response_format or {}).get("type")
    if kind == "json_object":
        return StructuredOutput()
    if kind == "json_schema":
        schema = (response_format or {}).get("json_schema") or {}
        return StructuredOutput(json_schema=schema.get("schema") or {"type": "object"})
    return None


def _logprobs(entries: list[TokenLogprob] | None) -> dict[str, Any] | None:
    """Log probabilities as vLLM's completions write them with
    ``return_tokens_as_token_ids`` (each token as ``token_id:N``)."""
    if entries is None:
        return None
    return {
        "tokens": [f"token_id:{e.token_id}" for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{f"token_id:{t}": v for t, v in e.top} for e in entries],
        "text_offset": [0] * len(entries),
    }


def _usage(prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def _forward_events(engine: SimEngine, publisher: KVEventPublisher) -> None:
    async with contextlib.aclosing(engine.kv_events()) as batches:
        async for batch in batches:
            await publisher.publish(batch)


def _lifespan(
    config: SimServerConfig, engine: SimEngine | None
) -> Callable[[FastAPI], AbstractAsyncContextManager[_State]]:
    """The app's lifespan: the engine, its metrics and its KV-event publisher."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[_State]:
        sim = engine or SimEngine(config.instance_id, config.engine)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SimEngineCollector(sim, config.model_name))
        publisher = None
        forward: asyncio.Task[None] | None = None
        if config.kv_events_endpoint is not None:
            publisher = KVEventPublisher(
                config.kv_events_endpoint,
                replay_endpoint=config.kv_replay_endpoint,
                form=config.kv_events_form,
            )
            forward = asyncio.create_task(_forward_events(sim, publisher))
            await asyncio.sleep(0)  # subscribe before the first request
        try:
            yield {"engine": sim, "publisher": publisher, "registry": registry}
        finally:
            await sim.aclose()
            if forward is not None:
                forward.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await forward
            if publisher is not None:
                await publisher.aclose()

    return lifespan


def create_app(config: SimServerConfig, *, engine: SimEngine | None = None) -> FastAPI:
    """A FastAPI app serving one simulated engine (``engine`` given, or made from ``config``)."""

    app = FastAPI(
        title=f"pdd-router simulated engine {config.instance_id}",
        lifespan=_lifespan(config, engine),
    )

    def state(request: Request) -> _State:
        return cast(_State, request.scope["state"])

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(400, str(exc.errors()), "BadRequestError")

    @app.get("/health")
    async def health(request: Request) -> Response:
        ok = await state(request)["engine"].health()
        return Response(status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        body = render_metrics(state(request)["registry"])
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": config.model_name,
            "object": "model",
            "owned_by": "pdd-router",
            "max_model_len": config.max_model_len,
        }
        return {"object": "list", "data": [card]}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request) -> Response:
        state(request)["engine"].reset_prefix_cache()
        return Response(status_code=200)

    @app.get("/sim/faults")
    async def get_faults(request: Request) -> SimFaults:
        return state(request)["engine"].faults

    @app.post("/sim/faults")
    async def set_faults(request: Request, faults: SimFaults) -> SimFaults:
        state(request)["engine"].faults = faults
        return faults

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request, body: CompletionBody) -> Response:
        return await _completions(state(request)["engine"], config, body)

    return app


async def _completions(sim: SimEngine, config: SimServerConfig, body: CompletionBody) -> Response:
    """``POST /v1/completions`` on ``sim``: vLLM's answer, streamed or whole."""
    if sim.faults.busy_next > 0:  # at capacity, as vLLM's and gateways' 429 say
        sim.faults.busy_next -= 1
        return _error(429, "too many requests (injected fault)", "RateLimitError")
    prompt = body.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, str) or any(isinstance(p, list) for p in prompt):
        return _error(400, "the simulated engine takes one prompt of token IDs", "BadRequestError")
    tokens = cast(list[int], prompt)
    rid = body.request_id or uuid.uuid4().hex
    if sim.is_running(rid):
        rid = f"{rid}-{uuid.uuid4().hex[:8]}"
    gen_request = GenerateRequest(
        request_id=rid,
        prompt_token_ids=tokens,
        max_tokens=body.max_tokens or 16,
        temperature=body.temperature or 0.0,
        ignore_eos=body.ignore_eos,
        kv_transfer_params=body.kv_transfer_params,
        sampling={"cache_salt": body.cache_salt} if body.cache_salt else {},
        logprobs=body.logprobs,
        structured=_structured(body.response_format),
    )
    deltas = sim.generate(gen_request)
    try:
        first = await anext(deltas)
    except EngineError as exc:
        await deltas.aclose()
        return _engine_error(exc)
    except BaseException:
        await deltas.aclose()
        raise
    response_id = f"cmpl-{rid}"
    created = int(time.time())
    head = {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": config.model_name,
    }
    params = body.kv_transfer_params or {}
    kv_out = None
    if params.get("do_remote_decode"):
        kv_out = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": config.instance_id,
            "remote_instance": config.instance_id,
            "request_id": rid,
        }
    want_ids = bool(body.return_token_ids)
    if not body.stream:
        return await _complete(head, tokens, first, deltas, want_ids, kv_out)
    options = body.stream_options or StreamOptions()
    events = _stream(head, tokens, first, deltas, want_ids, options)
    return StreamingResponse(events, media_type="text/event-stream")


async def _complete(
    head: dict[str, Any],
    prompt: list[int],
    first: TokenDelta,
    deltas: AsyncGenerator[TokenDelta, None],
    want_ids: bool,
    kv_out: dict[str, Any] | None,
) -> Response:
    out = list(first.token_ids)
    logprobs = None if first.logprobs is None else list(first.logprobs)
    last = first
    try:
        async for delta in deltas:
            out.extend(delta.token_ids)
            if logprobs is not None:
                logprobs.extend(delta.logprobs or [])
            last = delta
    except EngineError as exc:
        return _error(500, str(exc), "InternalServerError")
    finally:
        await deltas.aclose()
    choice = {
        "index": 0,
        "text": "",
        "logprobs": _logprobs(logprobs),
        "finish_reason": last.finish_reason,
        "stop_reason": None,
        "token_ids": out if want_ids else None,
        "prompt_token_ids": prompt if want_ids else None,
    }
    return JSONResponse(
        {
            **head,
            "choices": [choice],
            "usage": _usage(len(prompt), len(out), first.cached_tokens),
            "kv_transfer_params": kv_out,
        }
    )


async def _stream(
    head: dict[str, Any],
    prompt: list[int],
    first: TokenDelta,
    deltas: AsyncGenerator[TokenDelta, None],
    want_ids: bool,
    options: StreamOptions,
) -> AsyncIterator[str]:
    """SSE chunks as vLLM sends them; the client going away closes (aborts) the generation."""
    produced = 0
    cached = first.cached_tokens
    try:
        delta: TokenDelta | None = first
        while delta is not None:
            produced += len(delta.token_ids)
            choice: dict[str, Any] = {
                "index": 0,
                "text": "",
                "logprobs": _logprobs(delta.logprobs),
                "finish_reason": delta.finish_reason,
                "stop_reason": None,
            }
            if want_ids:
                choice["token_ids"] = delta.token_ids
                if delta is first:
                    choice["prompt_token_ids"] = prompt
            chunk: dict[str, Any] = {**head, "choices": [choice]}
            if options.continuous_usage_stats:
                chunk["usage"] = _usage(len(prompt), produced, None)
            yield _sse(chunk)
            delta = await anext(deltas, None)
        if options.include_usage:
            yield _sse({**head, "choices": [], "usage": _usage(len(prompt), produced, cached)})
    except EngineError as exc:
        error = {"message": str(exc), "type": "InternalServerError", "param": None, "code": 500}
        yield _sse({"error": error})
    finally:
        await deltas.aclose()
    yield "data: [DONE]\n\n"

"""OpenAI's chat completions and model list: the conversation rendered with the model's
chat template and tokenized as the engine would (``chat_prompt.py``), then decided and
executed like any completion (``generation.py``), the answer's text decoded by the router."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from router.service.api import job_of
from router.service.chat_prompt import chat_prompt
from router.service.errors import ApiError
from router.service.generation import Generation, stream_events
from router.service.schemas import ERROR_RESPONSES, ChatRequest
from router.service.state import ServiceState
from router.service.text_stream import TextStream
from router.service.tokenize_api import model_vocabulary

__all__ = ["openai_router"]

openai_router = APIRouter(responses=ERROR_RESPONSES(400, 404, 413, 422, 503), tags=["openai"])


def _state(request: Request) -> ServiceState:
    state: ServiceState = request.state.svc
    return state


@openai_router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    """The models requests may name: configured ones and those instances declare."""
    svc = _state(request)
    return {"object": "list", "data": [_card(svc, name) for name in svc.models.names(svc.pool)]}


@openai_router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, request: Request) -> dict[str, Any]:
    """One model of the list (404 ``model_not_found`` for a model not served)."""
    svc = _state(request)
    names = svc.models.names(svc.pool)
    if model not in names:
        raise ApiError(
            404, f"The model `{model}` does not exist. Known models: {', '.join(names)}",
            param="model", code="model_not_found",
        )  # fmt: skip
    return _card(svc, model)


def _card(svc: ServiceState, name: str) -> dict[str, Any]:
    """A model as OpenAI's model endpoints describe it."""
    return {"id": name, "object": "model", "created": int(svc.started), "owned_by": "pdd-router",
            **model_vocabulary(svc, name)}  # fmt: skip


@openai_router.post(
    "/v1/chat/completions",
    responses={
        **ERROR_RESPONSES(502),
        200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE when streaming"},
    },
)
async def chat_completions(body: ChatRequest, request: Request) -> object:
    """OpenAI's chat completion: rendered and tokenized by the router, decided, executed."""
    svc = _state(request)
    model = svc.models.resolve(body.model, svc.pool)
    tokenizer = svc.models.tokenizer(model, svc.pool)
    with svc.tracer.start_as_current_span("pdd.tokenize"):
        prompt = await chat_prompt(svc, body, tokenizer)
    given = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
    max_tokens = body.max_completion_tokens or body.max_tokens
    job = job_of(svc, body, model, prompt, max_tokens, given, prompt_field="messages",
                 tokenizer=tokenizer)  # fmt: skip
    run = await Generation.start(svc, request, job)
    text = TextStream(tokenizer, job.prompt, body.stops())
    created = int(time.time())
    head = {"id": run.request_id, "created": created, "model": model.name}
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        chunk = {**head, "object": "chat.completion.chunk"}
        events = stream_events(run, text, chunk, _ChatChunks(), include_usage)
        return StreamingResponse(events, media_type="text/event-stream", headers=run.headers())
    tokens = 0
    try:
        async for ids in run.until_stopped(request, text):
            tokens += len(ids)
        run.finish(stopped=text.stopped)
    finally:
        await run.close()
    reason = "stop" if text.stopped else run.outcome.finish_reason
    message = {"role": "assistant", "content": text.text}
    payload = {
        **head, "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": reason, "logprobs": None}],
        "usage": run.usage(tokens), "pdd": run.served(),
    }  # fmt: skip
    return JSONResponse(payload, headers=run.headers())


class _ChatChunks:
    """A chat stream's choices: the assistant's role first, then content deltas."""

    def opening(self) -> list[dict[str, Any]]:
        return [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]

    def delta(self, text: str, ids: list[int]) -> dict[str, Any] | None:
        if not text:
            return None
        return {"index": 0, "delta": {"content": text}, "finish_reason": None}

    def final(self, text: str, reason: str) -> dict[str, Any]:
        return {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": reason}

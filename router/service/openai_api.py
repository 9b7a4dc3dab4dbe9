"""OpenAI's chat completions and model list: the conversation rendered with the model's
chat template and tokenized as the engine would (``chat_prompt.py``), then decided and
executed like any completion (``generation.py``), the answer's text decoded by the router."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engines_adapter.contract import TokenLogprob
from router.service.api import job_of
from router.service.chat_answer import answer_plan
from router.service.chat_prompt import chat_prompt
from router.service.deps import AdmissionDep, GenerationDep, ModelsDep, ServiceDep
from router.service.errors import ApiError
from router.service.event_stream import stream_events
from router.service.generation import Generation
from router.service.logprob_format import chat_logprobs
from router.service.parts import ServedModels
from router.service.schemas import ERROR_RESPONSES, ChatRequest
from router.service.text_stream import TextStream
from router.service.tokenize_api import model_vocabulary
from router.settings import ServiceSettings
from router.tokenization.protocol import AsyncTokenizerLike
from router.tool_calls.stream import AnswerParser

__all__ = ["openai_router"]

openai_router = APIRouter(responses=ERROR_RESPONSES(400, 404, 413, 422, 503), tags=["openai"])


@openai_router.get("/v1/models")
async def list_models(models: ModelsDep, service: ServiceDep) -> dict[str, Any]:
    """The models requests may name: configured ones and those instances declare."""
    return {"object": "list", "data": [_card(models, service, n) for n in models.names()]}


@openai_router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, models: ModelsDep, service: ServiceDep) -> dict[str, Any]:
    """One model of the list (404 ``model_not_found`` for a model not served)."""
    names = models.names()
    if model not in names:
        raise ApiError(
            404, f"The model `{model}` does not exist. Known models: {', '.join(names)}",
            param="model", code="model_not_found",
        )  # fmt: skip
    return _card(models, service, model)


def _card(models: ServedModels, service: ServiceSettings, name: str) -> dict[str, Any]:
    """A model as OpenAI's model endpoints describe it."""
    return {"id": name, "object": "model", "created": int(models.since),
            "owned_by": "pdd-router", **model_vocabulary(models, service, name)}  # fmt: skip


@openai_router.post(
    "/v1/chat/completions",
    responses={
        **ERROR_RESPONSES(502),
        200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE when streaming"},
    },
)
async def chat_completions(
    body: ChatRequest, request: Request, gen: GenerationDep, admission: AdmissionDep
) -> object:
    """OpenAI's chat completion: rendered and tokenized by the router, decided, executed;
    the answer's text parsed into reasoning, content and tool calls."""
    model = gen.models.resolve(body.model)
    admission.resolved(model)
    tokenizer = gen.models.tokenizer(model)
    plan = answer_plan(body, model, tokenizer)
    with gen.tracer.start_as_current_span("pdd.tokenize"):
        prompt = await chat_prompt(body, tokenizer, gen.service.prompt_char_limit,
                                   gen.models.templates)  # fmt: skip
    given = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
    max_tokens = body.max_completion_tokens or body.max_tokens
    job = job_of(gen.service, body, model, prompt, max_tokens, given, prompt_field="messages",
                 tokenizer=tokenizer)  # fmt: skip
    job.session_id = body.session()
    if body.logprobs:
        gen.models.require(model, "logprobs", "logprobs")
        job.logprobs = body.top_logprobs or 0
    if plan.structured is not None:
        field = "response_format" if body.response_format is not None else "tool_choice"
        gen.models.require(model, "structured_output", field)
        job.structured = plan.structured
    admission.starting()
    run = await Generation.start(gen, request, job)
    text = TextStream(tokenizer, job.prompt, body.stops(), body.stop_token_ids or ())
    head = {"id": run.request_id, "created": int(time.time()), "model": model.name}
    top = body.top_logprobs or 0
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        chunk = {**head, "object": "chat.completion.chunk"}
        form = _ChatChunks(plan.parser(), tokenizer if body.logprobs else None, top)
        events = stream_events(run, text, chunk, form, include_usage)
        return StreamingResponse(events, media_type="text/event-stream", headers=run.headers())
    tokens = 0
    try:
        async for ids in run.until_stopped(request, text):
            tokens += len(ids)
        run.finish(stopped=text.stopped)
    finally:
        await run.close()
    parser = plan.parser()
    answer = parser.message(text.text)
    reason = "stop" if text.stopped else run.outcome.finish_reason
    message: dict[str, Any] = {"role": "assistant", "content": answer.content}
    if answer.reasoning is not None:
        message["reasoning_content"] = answer.reasoning
    if answer.tool_calls:
        message["tool_calls"] = answer.tool_calls
        reason = "tool_calls"
    logprobs = (
        await chat_logprobs(tokenizer, run.take_logprobs(tokens), top) if body.logprobs else None
    )
    choice = {"index": 0, "message": message, "finish_reason": reason, "logprobs": logprobs}
    payload = {
        **head, "object": "chat.completion", "choices": [choice],
        "usage": run.usage(tokens), "pdd": run.served(),
    }  # fmt: skip
    return JSONResponse(payload, headers=run.headers())


class _ChatChunks:
    """A chat stream's choices: the assistant's role first, then deltas of reasoning,
    content and tool calls as the parser gives them out, each token's log probabilities
    on the first choice sent after it."""

    def __init__(self, parser: AnswerParser, tokenizer: AsyncTokenizerLike | None, top: int):
        self._parser, self._tokenizer, self._top = parser, tokenizer, top
        self._pending: list[TokenLogprob] = []

    def opening(self) -> list[dict[str, Any]]:
        return [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]

    async def _choices(self, deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        choices = [{"index": 0, "delta": d, "finish_reason": None} for d in deltas]
        if choices and self._tokenizer is not None and self._pending:
            choices[0]["logprobs"] = await chat_logprobs(self._tokenizer, self._pending, self._top)
            self._pending = []
        return choices

    async def delta(
        self, text: str, ids: list[int], logprobs: list[TokenLogprob]
    ) -> list[dict[str, Any]]:
        self._pending.extend(logprobs)
        return await self._choices(self._parser.push(text) if text else [])

    async def final(self, text: str, reason: str) -> list[dict[str, Any]]:
        deltas = (self._parser.push(text) if text else []) + self._parser.finish()
        choices = await self._choices(deltas)
        if self._parser.called:
            reason = "tool_calls"
        return [*choices, {"index": 0, "delta": {}, "finish_reason": reason}]

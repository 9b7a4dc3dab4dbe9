"""The request path: POST /v1/route (decide only) and POST /v1/completions (decide and
execute, OpenAI's completions: text or token-ID prompts, one or several)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from engines_adapter.contract import TokenLogprob
from policies.types import Decision, RequestView
from router.hashing import HashExtras, chain_hashes
from router.service.decide import check_prompt
from router.service.deps import AdmissionDep, GenerationDep
from router.service.errors import ApiError
from router.service.event_stream import stream_events
from router.service.generation import Generation, Job
from router.service.logprob_format import completion_logprobs
from router.service.models import ResolvedModel
from router.service.parts import GenerationDeps, ServedModels
from router.service.prompt_budget import check_prompt_chars, over_token_limit
from router.service.refusals import Admission
from router.service.route_body import FastRouteBody, decode_route_body
from router.service.schemas import (
    ERROR_RESPONSES,
    CompletionRequest,
    CompletionResponse,
    GenerationFields,
    RouteRequest,
    input_limits,
)
from router.service.tenancy import decision_json, shows_predictions
from router.service.text_stream import TextStream
from router.settings import ServiceSettings
from router.tokenization.protocol import AsyncTokenizerLike, TooManyTokens

__all__ = ["api_router", "decide_route", "job_of"]

api_router = APIRouter(responses=ERROR_RESPONSES(400, 404, 413, 422, 503))


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
async def route(request: Request, gen: GenerationDep) -> Response:
    """Decide a request without executing it (the body is a ``RouteRequest``: token IDs, or
    a trace's block IDs with their block size). Its predictions are shown for a request
    with a ``cache_salt``, or with ``service.show_shared_predictions`` on."""
    body = _route_body(await request.body())
    decision = await decide_route(gen, body)
    visible = shows_predictions(gen.service, body.cache_salt)
    return Response(decision_json(decision, visible), media_type="application/json")


async def decide_route(gen: GenerationDeps, body: FastRouteBody | RouteRequest) -> Decision:
    """The decision for a route request (ApiError for a prompt the service refuses, an
    unknown model, or no instance to route to)."""
    model = gen.models.resolve(body.model)
    if body.token_ids is not None:
        check_prompt(gen.service, body.token_ids, "token_ids")
        extras = HashExtras(cache_salt=body.cache_salt) if body.cache_salt else None
        chain = chain_hashes(body.token_ids, gen.block_size, gen.hash_seed, extras=extras)
        view = RequestView(chain.hashes, chain.block_size, chain.num_tokens, body.max_tokens,
                           body.session_id, time.time(), gen.ids.next())  # fmt: skip
    else:
        assert body.hash_ids is not None
        assert body.block_size is not None
        length = body.input_length or len(body.hash_ids) * body.block_size
        view = RequestView(tuple(body.hash_ids), body.block_size, length, body.max_tokens,
                           body.session_id, time.time(), gen.ids.next())  # fmt: skip
    return (await gen.decider.decide(view, model=model.instances_of))[0]


def job_of(
    service: ServiceSettings, body: GenerationFields, model: ResolvedModel,
    prompt: Sequence[int], max_tokens: int | None, max_tokens_field: str = "max_tokens",
    prompt_field: str = "prompt", tokenizer: AsyncTokenizerLike | None = None,
) -> Job:  # fmt: skip
    """A generation job from a request's fields (ApiError for a limit it passes, naming the
    fields the request gave its prompt and its output limit in)."""
    check_prompt(service, prompt, prompt_field)
    wanted = max_tokens or service.max_tokens_default
    if wanted > service.max_tokens_limit:
        raise ApiError(400, f"{max_tokens_field} {wanted} is over the limit of "
                       f"{service.max_tokens_limit}", param=max_tokens_field)  # fmt: skip
    sampling = body.passed_through()
    if body.cache_salt is not None:
        sampling["cache_salt"] = body.cache_salt
    lora = model.settings is not None and model.settings.lora_adapter
    extras = None
    if body.cache_salt is not None or lora:
        extras = HashExtras(cache_salt=body.cache_salt, lora_name=model.name if lora else None)
    if body.stop and model.settings is None:
        sampling["stop"] = body.stop  # no tokenizer here: the engine looks for it
    return Job(
        prompt, wanted, model, temperature=body.temperature, ignore_eos=body.ignore_eos,
        sampling=sampling, session_id=body.session_id or body.user, extras=extras,
        vocab_end=_vocab_end(service, tokenizer),
    )  # fmt: skip


def _vocab_end(service: ServiceSettings, tokenizer: AsyncTokenizerLike | None) -> int | None:
    """What token IDs from an engine must stay below: the tokenizer's vocabulary when the
    router decodes with one, else ``service.vocab_size`` (None: unbounded)."""
    inner = getattr(tokenizer, "tokenizer", None)
    size = getattr(inner, "vocab_size", None)
    return size if isinstance(size, int) else service.vocab_size


async def _prompts(
    models: ServedModels, service: ServiceSettings, body: CompletionRequest,
    model: ResolvedModel,
) -> tuple[list[list[int]], AsyncTokenizerLike | None]:  # fmt: skip
    """The prompts' token IDs (text tokenized as the engine would) and the tokenizer."""
    prompt = body.prompt
    texts = [prompt] if isinstance(prompt, str) else prompt if isinstance(prompt[0], str) else []
    has_tokenizer = model.settings is not None
    tokenizer = models.tokenizer(model) if (texts or has_tokenizer) else None
    if texts:
        assert tokenizer is not None
        chars = sum(len(str(t)) for t in texts)
        check_prompt_chars(chars, service.prompt_char_limit, "prompt")
        try:
            encoded = await asyncio.gather(*(tokenizer.encode_text(str(t)) for t in texts))
        except TooManyTokens as exc:
            raise over_token_limit(exc, "prompt") from None
        return [list(ids) for ids in encoded], tokenizer
    if isinstance(prompt[0], list):
        return [list(p) for p in prompt if isinstance(p, list)], tokenizer
    return [[t for t in prompt if isinstance(t, int)]], tokenizer


@api_router.post(
    "/v1/completions",
    tags=["openai"],
    response_model=CompletionResponse,
    responses={
        **ERROR_RESPONSES(502),
        200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE when streaming"},
    },
)
async def completions(
    body: CompletionRequest, request: Request, gen: GenerationDep, admission: AdmissionDep
) -> object:
    """OpenAI's completions: each prompt is decided, then executed along its decision."""
    model = gen.models.resolve(body.model)
    admission.resolved(model)
    with gen.tracer.start_as_current_span("pdd.tokenize"):
        prompts, tokenizer = await _prompts(gen.models, gen.service, body, model)
    if body.stream and len(prompts) > 1:
        raise ApiError(400, "stream a single prompt per request (several prompts are served "
                       "without streaming)", param="prompt")  # fmt: skip
    jobs = [job_of(gen.service, body, model, p, body.max_tokens, tokenizer=tokenizer)
            for p in prompts]  # fmt: skip
    if body.logprobs is not None:
        gen.models.require(model, "logprobs", "logprobs")
        for job in jobs:
            job.logprobs = body.logprobs
    if body.stream:
        return await _stream_completion(gen, admission, request, jobs[0], tokenizer, body)
    admission.starting()
    runs = await asyncio.gather(
        *(_complete(gen, request, j, tokenizer, body, i) for i, j in enumerate(jobs))
    )
    first = runs[0][0]
    choices = [{**choice, "index": i} for i, (_, choice, _) in enumerate(runs)]
    completion = sum(tokens for _, _, tokens in runs)
    usage = first.usage(completion) if len(runs) == 1 else _summed_usage(runs, completion)
    payload = {
        "id": first.request_id, "object": "text_completion", "created": int(time.time()),
        "model": model.name, "choices": choices, "usage": usage, "pdd": first.served(),
    }  # fmt: skip
    return JSONResponse(payload, headers=first.headers())


def _summed_usage(runs: list[tuple[Generation, dict[str, object], int]],
                  completion: int) -> dict[str, object]:  # fmt: skip
    prompt = sum(len(run.job.prompt) for run, _, _ in runs)
    cached = sum(run.cached_tokens()[0] for run, _, _ in runs)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip


async def _complete(
    gen: GenerationDeps, request: Request, job: Job, tokenizer: AsyncTokenizerLike | None,
    body: CompletionRequest, index: int,
) -> tuple[Generation, dict[str, object], int]:  # fmt: skip
    run = await Generation.start(gen, request, job)
    text = TextStream(tokenizer, job.prompt, body.stops(), body.stop_token_ids or ())
    tokens: list[int] = []
    try:
        async for ids in run.until_stopped(request, text):
            tokens.extend(ids)
        run.finish(stopped=text.stopped)
    finally:
        await run.close()  # after finish: an unfinished request stops being watched
    reason = "stop" if text.stopped else run.outcome.finish_reason
    echoed = await _echo(body, job, tokenizer, index)
    logprobs = None
    if body.logprobs is not None:
        entries = run.take_logprobs(len(tokens))
        logprobs = await completion_logprobs(tokenizer, entries, body.logprobs, len(echoed))
    choice = {"index": 0, "text": echoed + text.text, "token_ids": tokens,
              "finish_reason": reason, "logprobs": logprobs}  # fmt: skip
    return run, choice, len(tokens)


async def _echo(
    body: CompletionRequest, job: Job, tokenizer: AsyncTokenizerLike | None, index: int
) -> str:
    """The text of prompt ``index`` as given (token IDs decoded) when the request asks for
    it back (``echo``), else ''."""
    if not body.echo:
        return ""
    prompt = body.prompt
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt[index], str):
        return str(prompt[index])
    if tokenizer is None:
        raise ApiError(400, "echo: the model has no tokenizer to write the prompt's text with",
                       param="echo")  # fmt: skip
    return await tokenizer.decode(list(job.prompt))


async def _stream_completion(
    gen: GenerationDeps, admission: Admission, request: Request, job: Job,
    tokenizer: AsyncTokenizerLike | None, body: CompletionRequest,
) -> StreamingResponse:  # fmt: skip
    echoed = await _echo(body, job, tokenizer, 0)
    admission.starting()
    run = await Generation.start(gen, request, job)
    text = TextStream(tokenizer, job.prompt, body.stops(), body.stop_token_ids or ())
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    head = {"id": run.request_id, "object": "text_completion", "created": int(time.time()),
            "model": job.model.name}  # fmt: skip

    top = body.logprobs
    form = _CompletionChunks(echoed, tokenizer, top)
    events = stream_events(run, text, head, form, include_usage)
    return StreamingResponse(events, media_type="text/event-stream", headers=run.headers())


class _CompletionChunks:
    """A completion stream's choices: text, the token IDs it came from and their log
    probabilities when asked (``top`` not None); the echoed prompt first."""

    def __init__(self, echoed: str, tokenizer: AsyncTokenizerLike | None, top: int | None) -> None:
        self._echoed, self._tokenizer, self._top = echoed, tokenizer, top or 0
        self._offset = len(echoed)
        self._asked = top is not None

    def opening(self) -> list[dict[str, Any]]:
        if not self._echoed:
            return []
        return [{"index": 0, "text": self._echoed, "token_ids": [], "finish_reason": None}]

    async def delta(
        self, text: str, ids: list[int], logprobs: list[TokenLogprob]
    ) -> list[dict[str, Any]]:
        choice: dict[str, Any] = {"index": 0, "text": text, "token_ids": ids,
                                  "finish_reason": None}  # fmt: skip
        if self._asked:
            given = await completion_logprobs(self._tokenizer, logprobs, self._top, self._offset)
            self._offset += sum(len(t) for t in given["tokens"])
            choice["logprobs"] = given
        return [choice]

    async def final(self, text: str, reason: str) -> list[dict[str, Any]]:
        return [{"index": 0, "text": text, "token_ids": [], "finish_reason": reason}]

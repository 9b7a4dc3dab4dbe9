"""vLLM's ``POST /tokenize`` and ``POST /detokenize``, answered with the router's own
tokenizer and chat template for the model: the token IDs a chat or completion request
would be sent to the engines with, and the text token IDs decode to.

Load tools (aiperf, guidellm, ``vllm bench serve``) and ``replay live`` ask these to fit
their prompts to the model; the request and answer shapes are vLLM's OpenAI server's
(``count``, ``max_model_len``, ``tokens``; ``prompt``). Limits are the chat endpoint's:
the body size (the ``BodyLimit`` middleware), the prompt's characters before anything is
rendered, its tokens after (``service.max_prompt_tokens``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from router.service.decide import check_prompt
from router.service.deps import ModelsDep, ServiceDep
from router.service.errors import ApiError, engine_tokenize_error
from router.service.input_limits import TokenId
from router.service.parts import ServedModels
from router.service.prompt_budget import check_prompt_chars, over_token_limit, text_chars
from router.service.schemas import ERROR_RESPONSES
from router.settings import ServiceSettings
from router.tokenization.chat_template import ChatTemplateError, normalize_messages
from router.tokenization.engine import EngineTokenizeError, EngineTokenizer
from router.tokenization.pool import AsyncTokenizer
from router.tokenization.protocol import AsyncTokenizerLike, TooManyTokens
from router.tokenization.template_sandbox import TemplateSandbox, is_literal_template

__all__ = [
    "DetokenizeRequest",
    "TokenizeChatRequest",
    "TokenizeCompletionRequest",
    "TokenizeResponse",
    "model_vocabulary",
    "tokenize_router",
]

tokenize_router = APIRouter(
    responses=ERROR_RESPONSES(400, 404, 413, 422, 502, 503), tags=["openai"]
)

BAD_IDS_NAMED = 10
"""Out-of-vocabulary token IDs a refusal names (and how many more there are)."""


class _TokenizeFields(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = Field(None, max_length=256, description="A served model")
    return_token_strs: StrictBool = Field(
        False, description="vLLM's token strings: not available here (refused when true)"
    )


class TokenizeCompletionRequest(_TokenizeFields):
    """A completion prompt, tokenized as ``/v1/completions`` tokenizes it."""

    prompt: str
    add_special_tokens: StrictBool = True


class TokenizeChatRequest(_TokenizeFields):
    """A conversation, rendered with the model's chat template and tokenized as
    ``/v1/chat/completions`` does."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    add_special_tokens: StrictBool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int = Field(description="The longest prompt the router takes, in tokens")
    tokens: list[int]


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = Field(None, max_length=256)
    tokens: list[TokenId]


class DetokenizeResponse(BaseModel):
    prompt: str


_TOKENIZE_BODY = {
    "required": True,
    "content": {"application/json": {"schema": {"oneOf": [
        TokenizeCompletionRequest.model_json_schema(), TokenizeChatRequest.model_json_schema(),
    ]}}},
}  # fmt: skip


def _parsed(raw: bytes) -> TokenizeCompletionRequest | TokenizeChatRequest:
    """The body as a chat request when it has ``messages``, else as a completion one (so
    that an error names a field of the form the client meant)."""
    try:
        data = json.loads(raw)
    except ValueError:
        data = None  # refused below as malformed JSON, in the validation's words
    chat = isinstance(data, dict) and "messages" in data
    kind = TokenizeChatRequest if chat else TokenizeCompletionRequest
    try:
        return kind.model_validate_json(raw)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None


@tokenize_router.post(
    "/tokenize", response_model=TokenizeResponse, openapi_extra={"requestBody": _TOKENIZE_BODY}
)
async def tokenize(request: Request, models: ModelsDep, service: ServiceDep) -> TokenizeResponse:
    """vLLM's ``/tokenize``: a ``prompt``, or ``messages`` rendered with the model's chat
    template, as the token IDs the router sends its engines."""
    body = _parsed(await request.body())
    if body.return_token_strs:
        raise ApiError(
            400, "return_token_strs: token strings are not available from this router; "
            "decode the IDs with /detokenize", param="return_token_strs",
        )  # fmt: skip
    model = models.resolve(body.model)
    tokenizer: AsyncTokenizerLike = models.tokenizer(model)
    limit = service.prompt_char_limit
    try:
        if isinstance(body, TokenizeChatRequest):
            field = "messages"
            ids = await _chat_ids(models.templates, body, tokenizer, limit)
        else:
            field = "prompt"
            check_prompt_chars(len(body.prompt), limit, field)
            ids = list(await tokenizer.encode_text(body.prompt, body.add_special_tokens))
    except EngineTokenizeError as exc:
        raise engine_tokenize_error(exc) from exc
    except TooManyTokens as exc:
        raise over_token_limit(exc, field) from None
    check_prompt(service, ids, field)
    max_len = getattr(tokenizer, "max_model_len", None)
    return TokenizeResponse(
        count=len(ids), tokens=ids,
        max_model_len=max_len if isinstance(max_len, int) else service.max_prompt_tokens,
    )  # fmt: skip


async def _chat_ids(
    sandbox: TemplateSandbox | None, body: TokenizeChatRequest, tokenizer: AsyncTokenizerLike,
    limit: int,
) -> list[int]:  # fmt: skip
    """The conversation's token IDs, as the chat endpoint renders it (a template of the
    request's own only in the sandbox, when the service allows those)."""
    kwargs = dict(body.chat_template_kwargs or {})
    if body.chat_template is not None:
        kwargs["chat_template"] = body.chat_template
    if body.continue_final_message:
        kwargs["continue_final_message"] = True
    check_prompt_chars(text_chars([body.messages, body.tools, kwargs]), limit, "messages")
    literal = is_literal_template(kwargs.get("chat_template"))
    where = "chat_template" if literal else "messages"
    if literal and sandbox is None:
        raise ApiError(
            400, "chat_template: chat templates supplied by requests are turned off on this "
            "service (service.request_templates.allow); name one of the model's templates or "
            "leave it out", param="chat_template",
        )  # fmt: skip
    try:
        if isinstance(tokenizer, AsyncTokenizer) and (literal or body.add_special_tokens):
            if literal:
                assert sandbox is not None  # refused above otherwise
                tok = tokenizer.tokenizer
                messages = normalize_messages(
                    body.messages, getattr(tok, "content_format", "string")
                )
                text = await sandbox.render(
                    str(kwargs.pop("chat_template")), messages,
                    special_tokens=getattr(tok, "special_tokens", None),
                    add_generation_prompt=body.add_generation_prompt, tools=body.tools, **kwargs,
                )  # fmt: skip
            else:
                text = await tokenizer.render_chat(
                    body.messages, body.add_generation_prompt, body.tools, **kwargs
                )
            return await tokenizer.encode_text(text, add_special_tokens=body.add_special_tokens)
        if body.add_special_tokens:  # an engine that renders: it honours the field itself
            kwargs["add_special_tokens"] = True
        ids = await tokenizer.encode_chat(
            body.messages, add_generation_prompt=body.add_generation_prompt, tools=body.tools,
            **kwargs,
        )  # fmt: skip
        return list(ids)
    except ChatTemplateError as exc:
        raise ApiError(400, f"{where}: {exc}", param=where) from exc
    except TooManyTokens:
        raise  # named by the caller, as the prompt's
    except (ValueError, TypeError) as exc:
        raise ApiError(400, f"messages: {exc}", param="messages") from exc


@tokenize_router.post("/detokenize", response_model=DetokenizeResponse)
async def detokenize(
    body: DetokenizeRequest, models: ModelsDep, service: ServiceDep
) -> DetokenizeResponse:
    """vLLM's ``/detokenize``: the text of token IDs (special tokens kept, as vLLM does)."""
    most = service.max_prompt_tokens + service.max_tokens_limit  # a whole context
    if len(body.tokens) > most:
        raise ApiError(400, f"tokens holds {len(body.tokens)} token IDs, over the limit of "
                       f"{most} (a prompt and an answer)", param="tokens")  # fmt: skip
    model = models.resolve(body.model)
    tokenizer: AsyncTokenizerLike = models.tokenizer(model)
    vocab = _vocabulary(tokenizer)
    if vocab is not None:
        _check_vocabulary(body.tokens, vocab)
    try:
        return DetokenizeResponse(prompt=await tokenizer.decode(body.tokens))
    except EngineTokenizeError as exc:
        raise engine_tokenize_error(exc) from exc


def model_vocabulary(models: ServedModels, service: ServiceSettings, name: str) -> dict[str, int]:
    """``{"vocab_size": N}`` for a model card when the router knows the model's
    vocabulary (its tokenizer's, else ``service.vocab_size``), so that a client making up
    token IDs (``replay live``) keeps them inside it; else nothing."""
    try:
        model = models.resolve(name)
        size = (
            _vocabulary(models.tokenizer(model))
            if model.settings is not None
            else service.vocab_size
        )
    except ApiError:  # an engine tokenizes, and none is there yet
        size = None
    return {} if size is None else {"vocab_size": size}


def _vocabulary(tokenizer: AsyncTokenizerLike) -> int | None:
    """Token IDs the router's tokenizer decodes are below this (None: an engine decodes,
    and checks them itself)."""
    if isinstance(tokenizer, EngineTokenizer):
        return None
    size = getattr(getattr(tokenizer, "tokenizer", None), "vocab_size", None)
    return size if isinstance(size, int) else None


def _check_vocabulary(tokens: Sequence[int], vocab: int) -> None:
    """400 naming the token IDs at or over ``vocab`` (the first ``BAD_IDS_NAMED``)."""
    if not tokens or max(tokens) < vocab:
        return
    bad = [t for t in tokens if t >= vocab]
    named = ", ".join(str(t) for t in bad[:BAD_IDS_NAMED])
    more = f" and {len(bad) - BAD_IDS_NAMED} more" if len(bad) > BAD_IDS_NAMED else ""
    raise ApiError(400, f"tokens: token IDs outside the model's vocabulary [0, {vocab}): "
                   f"{named}{more}", param="tokens")  # fmt: skip

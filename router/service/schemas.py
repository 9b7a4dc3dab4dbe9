"""Request and response bodies of the HTTP API."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    Tag,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from policies.tiers import Tier
from router.kv_relay.settings import INSTANCE_ID
from router.service.engine_fields import (
    ROUTER_OWNED_FIELDS,
    engine_fields,
    finite,
    router_owned,
    unknown_field,
)
from router.settings import ServiceSettings

__all__ = [
    "ERROR_RESPONSES",
    "ChatRequest",
    "CompletionChoice",
    "CompletionRequest",
    "CompletionResponse",
    "InputLimits",
    "InstanceConfig",
    "InstanceStatus",
    "KVEventsBody",
    "RouteRequest",
    "StreamOptions",
    "Usage",
    "input_limits",
    "over_limit",
    "use_input_limits",
]

TOKEN_ID_END = 1 << 63
"""Token IDs are below it: numpy hashes them as int64, engines take them as int64."""
BLOCK_ID_END = 1 << 64
"""Block IDs are below it: the router's hashes are unsigned 64-bit, as the indexes store them."""
MAX_TEMPERATURE = 2.0

TokenId = Annotated[StrictInt, Field(ge=0, lt=TOKEN_ID_END)]
BlockId = Annotated[StrictInt, Field(ge=0, lt=BLOCK_ID_END)]


@dataclass(frozen=True, slots=True)
class InputLimits:
    """The configured bounds the request models check (from ServiceSettings)."""

    max_prompt_tokens: int
    max_hash_ids: int
    max_tokens_limit: int

    @classmethod
    def of(cls, service: ServiceSettings) -> InputLimits:
        return cls(service.max_prompt_tokens, service.max_hash_ids, service.max_tokens_limit)


_DEFAULT_LIMITS = InputLimits.of(ServiceSettings())
_LIMITS: ContextVar[InputLimits | None] = ContextVar("pdd_router_input_limits", default=None)


def input_limits() -> InputLimits:
    """The limits of the service handling the current request (the defaults outside one)."""
    return _LIMITS.get() or _DEFAULT_LIMITS


@contextlib.contextmanager
def use_input_limits(service: ServiceSettings | None) -> Iterator[None]:
    """Validate the request models of the enclosed code against ``service``'s limits."""
    if service is None:
        yield
        return
    token = _LIMITS.set(InputLimits.of(service))
    try:
        yield
    finally:
        _LIMITS.reset(token)


def over_limit(message: str, param: str | None = None) -> PydanticCustomError:
    """A value over a configured limit: the error handlers answer it with 400, naming
    ``param`` when the error is not raised on the field itself."""
    return PydanticCustomError("over_limit", message, {"param": param} if param else None)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str  # OpenAI's code where it has one (model_not_found), else the HTTP status


class ErrorResponse(BaseModel):
    """Every error, in OpenAI's shape."""

    error: ErrorDetail


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    text = {
        400: "Bad input: malformed JSON, token IDs out of range, prompt over the limit",
        401: "Missing or wrong API key (admin endpoints, when a key is configured)",
        404: "Unknown instance",
        409: "An instance with this id is registered already (replace=true replaces it)",
        413: "Request body over the size limit",
        422: "Wrong field types or values; the message names the field",
        502: "An engine failed after the response started",
        503: "No healthy engine can serve the request; retry after Retry-After seconds",
    }
    return {code: {"model": ErrorResponse, "description": text[code]} for code in codes}


ERROR_RESPONSES = _errors


class RouteRequest(BaseModel):
    """A decision without execution: token IDs, or a trace's block IDs with their block size."""

    model_config = ConfigDict(extra="forbid", strict=True)

    token_ids: list[TokenId] | None = Field(None, description="Prompt token IDs")
    hash_ids: list[BlockId] | None = Field(
        None, description="Prefix-chained block IDs (traces), each in [0, 2**64)"
    )
    block_size: int | None = Field(None, gt=0, description="Tokens per block of hash_ids")
    input_length: int | None = Field(None, gt=0, description="Prompt tokens, with hash_ids")
    max_tokens: int | None = Field(None, gt=0)
    session_id: str | None = Field(None, max_length=256)
    model: str | None = Field(None, max_length=256, description="Decide among its instances")
    cache_salt: str | None = Field(
        None, max_length=256, description="The tenant's cache salt (with token_ids): the "
        "decision over its own salt's blocks, predictions shown",
    )  # fmt: skip

    @field_validator("hash_ids")
    @classmethod
    def _few_blocks(cls, ids: list[int] | None) -> list[int] | None:
        limit = input_limits().max_hash_ids
        if ids is not None and len(ids) > limit:
            raise over_limit(f"{len(ids)} block IDs, over the limit of {limit}")
        return ids

    @field_validator("block_size", "input_length")
    @classmethod
    def _within_prompt(cls, value: int | None) -> int | None:
        limit = input_limits().max_prompt_tokens
        if value is not None and value > limit:
            raise over_limit(f"{value} tokens, over the prompt limit of {limit}")
        return value

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens(cls, value: int | None) -> int | None:
        limit = input_limits().max_tokens_limit
        if value is not None and value > limit:
            raise over_limit(f"max_tokens {value} is over the limit of {limit}")
        return value

    @model_validator(mode="after")
    def _one_prompt(self) -> RouteRequest:
        if (self.token_ids is None) == (self.hash_ids is None):
            raise ValueError("give exactly one of token_ids or hash_ids")
        if self.hash_ids is not None and self.block_size is None:
            raise ValueError("hash_ids needs block_size")
        if self.token_ids is not None and not self.token_ids:
            raise ValueError("token_ids must not be empty")
        if self.cache_salt is not None and self.hash_ids is not None:
            raise ValueError("cache_salt applies to token_ids, not to a trace's hash_ids")
        if self.hash_ids is not None and self.input_length is None:
            assert self.block_size is not None
            limit = input_limits().max_prompt_tokens
            if len(self.hash_ids) * self.block_size > limit:
                raise over_limit(
                    f"{len(self.hash_ids)} blocks of {self.block_size} tokens are over the "
                    f"prompt limit of {limit} tokens (give input_length for a shorter last block)",
                    "hash_ids",
                )
        return self


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)

    include_usage: StrictBool = False


Stop = str | list[Annotated[str, Field(min_length=1)]] | None


class GenerationFields(BaseModel):
    """What OpenAI's completion and chat requests share."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = Field(None, description="A served model (GET /v1/models)")
    max_tokens: int | None = Field(None, gt=0)
    temperature: StrictFloat = Field(0.0, ge=0, le=MAX_TEMPERATURE, allow_inf_nan=False)
    n: StrictInt = Field(1, description="Choices per prompt: only 1 is supported")
    stop: Stop = Field(None, description="Text that ends the generation (not included)")
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False
    cache_salt: str | None = Field(
        None, max_length=256, description="Isolates this tenant's cached prefixes (vLLM)"
    )
    user: str | None = Field(None, description="Used as the session id when no session_id")
    session_id: str | None = Field(None, max_length=256)

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise PydanticCustomError(
                "unsupported", "only n=1 is supported: send the request n times for n choices"
            )
        return n

    @model_validator(mode="after")
    def _checked_extras(self) -> GenerationFields:
        """Extra fields: engine fields only (others refused, named), all numbers finite."""
        extra = self.model_extra or {}
        name = router_owned(extra)
        if name is not None:
            raise PydanticCustomError(
                "router_owned", "{field} may not be set by a client: {why}",
                {"field": name, "why": ROUTER_OWNED_FIELDS[name], "param": name},
            )  # fmt: skip
        name = unknown_field(extra)
        if name is not None:
            raise PydanticCustomError(
                "unsupported", "{field} is not a field this router honours or passes on to "
                "its engines (docs/security.md lists those it does)",
                {"param": name, "field": name},
            )  # fmt: skip
        for key, value in extra.items():
            if not finite(value):
                raise PydanticCustomError(
                    "not_finite", f"{key} holds a number that is not finite (NaN or infinity)",
                    {"param": key},
                )  # fmt: skip
        return self

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def passed_through(self) -> dict[str, Any]:
        """The request's fields beyond the schema that go on to the engine (the allowlisted
        sampling and output fields; any other was refused)."""
        return engine_fields(self.model_extra or {})


def _prompt_kind(value: Any) -> str:
    """Which form a completion prompt takes (so an error names the form it broke)."""
    if isinstance(value, str):
        return "text"
    if isinstance(value, list) and value:
        first = value[0]
        if isinstance(first, str):
            return "texts"
        if isinstance(first, list):
            return "token_id_lists"
    return "token_ids"


class CompletionRequest(GenerationFields):
    """OpenAI's completion request: the prompt as text, token IDs, or a list of either."""

    prompt: Annotated[
        Annotated[str, Field(min_length=1), Tag("text")]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1), Tag("texts")]
        | Annotated[list[TokenId], Field(min_length=1), Tag("token_ids")]
        | Annotated[
            list[Annotated[list[TokenId], Field(min_length=1)]],
            Field(min_length=1),
            Tag("token_id_lists"),
        ],
        Discriminator(_prompt_kind),
    ] = Field(description="Text, a list of texts, token IDs, or a list of token-ID lists")


class ChatRequest(GenerationFields):
    """OpenAI's chat completion request."""

    messages: list[dict[str, Any]] = Field(
        min_length=1, description="The conversation: role and content (text or text parts)"
    )
    max_completion_tokens: int | None = Field(None, gt=0)
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: StrictBool = True
    chat_template: str | None = Field(
        None, description="The name of one of the model's chat templates, or a template of "
        "the request's own (refused unless the service allows request templates)",
    )  # fmt: skip
    chat_template_kwargs: dict[str, Any] | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str = ""
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    logprobs: None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    pdd: dict[str, Any] = Field(
        default_factory=dict, description="Pipeline and instances that served the request"
    )


class InstanceConfig(BaseModel):
    """An engine instance the router drives."""

    model_config = ConfigDict(extra="forbid")

    instance_id: str = Field(pattern=rf"^{INSTANCE_ID.pattern}$")
    tier: Tier
    datacenter: str = Field("A", min_length=1, max_length=64)
    url: str = Field("inproc://", description="Engine base URL; inproc:// for a built-in sim")
    adapter: Literal["sim", "vllm", "sglang"] = "vllm"
    capacity_tokens: StrictInt = Field(1_000_000, gt=0, description="KV capacity in tokens")
    max_batch: StrictInt = Field(256, gt=0)
    kv_events_endpoint: str | None = Field(None, description="ZMQ endpoint of KV events")
    model: str | None = Field(
        None, max_length=256, description="The model name it serves (OpenAI's `model`): a "
        "request for a model goes only to its instances; none: the unnamed default model",
    )  # fmt: skip

    @field_validator("url")
    @classmethod
    def _engine_url(cls, url: str) -> str:
        """http(s) with a host, or inproc:// (the built-in sim): the router sends prompts there."""
        from urllib.parse import urlsplit

        if url == "inproc://":
            return url
        parts = urlsplit(url)
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host (inproc:// for sim)")
        _ = parts.port  # ValueError when the port is not a number in range
        return url


class InstanceStatus(InstanceConfig):
    healthy: bool
    running: int
    queued: int
    indexed_blocks: int


class KVEventsBody(BaseModel):
    """A batch of KV events in vLLM's schema (events as maps or positional arrays).

    Bounds (400 naming the value beyond them): at most ``service.max_kv_events_per_batch``
    events, at most ``service.max_kv_event_tokens`` token IDs per event, each in
    [0, 2**63) and below ``service.vocab_size`` when set; integer block hashes in the
    signed or unsigned 64-bit range.
    """

    model_config = ConfigDict(strict=True)

    instance_id: str
    timestamp: StrictFloat = Field(0.0, allow_inf_nan=False)
    events: list[dict[str, Any] | list[Any]] = Field(
        description='Maps ({"type": "BlockStored", "block_hashes": [...], "parent_block_hash": '
        '..., "token_ids": [...], "block_size": 16}) or tagged arrays (["BlockStored", '
        "block_hashes, parent_block_hash, token_ids, block_size, ...])"
    )

"""Request and response bodies of the HTTP API."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    model_validator,
)

from policies.tiers import Tier

__all__ = [
    "ERROR_RESPONSES",
    "CompletionChoice",
    "CompletionRequest",
    "CompletionResponse",
    "InstanceConfig",
    "InstanceStatus",
    "KVEventsBody",
    "RouteRequest",
    "StreamOptions",
    "Usage",
]


TokenId = Annotated[StrictInt, Field(ge=0)]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    """Every error, in OpenAI's shape."""

    error: ErrorDetail


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    text = {
        400: "Bad input: malformed JSON, token IDs out of range, prompt over the limit",
        401: "Missing or wrong API key (admin endpoints, when a key is configured)",
        404: "Unknown instance",
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
    hash_ids: list[int] | None = Field(None, description="Prefix-chained block IDs (traces)")
    block_size: int | None = Field(None, gt=0, description="Tokens per block of hash_ids")
    input_length: int | None = Field(None, gt=0, description="Prompt tokens, with hash_ids")
    max_tokens: int | None = Field(None, gt=0)
    session_id: str | None = Field(None, max_length=256)

    @model_validator(mode="after")
    def _one_prompt(self) -> RouteRequest:
        if (self.token_ids is None) == (self.hash_ids is None):
            raise ValueError("give exactly one of token_ids or hash_ids")
        if self.hash_ids is not None and self.block_size is None:
            raise ValueError("hash_ids needs block_size")
        if self.token_ids is not None and not self.token_ids:
            raise ValueError("token_ids must not be empty")
        return self


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)

    include_usage: StrictBool = False


class CompletionRequest(BaseModel):
    """OpenAI's completion request, with the prompt as a list of token IDs."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    prompt: list[TokenId] = Field(min_length=1, description="Prompt token IDs")
    max_tokens: int | None = Field(None, gt=0)
    temperature: StrictFloat = Field(0.0, ge=0)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False
    user: str | None = Field(None, description="Used as the session id when no session_id")
    session_id: str | None = Field(None, max_length=256)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str = ""
    token_ids: list[int]
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

    instance_id: str = Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    tier: Tier
    datacenter: str = Field("A", min_length=1, max_length=64)
    url: str = Field("inproc://", description="Engine base URL; inproc:// for a built-in sim")
    adapter: Literal["sim", "vllm", "sglang"] = "vllm"
    capacity_tokens: StrictInt = Field(1_000_000, gt=0, description="KV capacity in tokens")
    max_batch: StrictInt = Field(256, gt=0)
    kv_events_endpoint: str | None = Field(None, description="ZMQ endpoint of KV events")


class InstanceStatus(InstanceConfig):
    healthy: bool
    running: int
    queued: int
    indexed_blocks: int


class KVEventsBody(BaseModel):
    """A batch of KV events in vLLM's schema (events as maps or positional arrays)."""

    model_config = ConfigDict(strict=True)

    instance_id: str
    timestamp: StrictFloat = 0.0
    events: list[dict[str, Any] | list[Any]]

"""Request and response bodies of the HTTP API."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

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

from router.service.chat_options import (
    MAX_TOP_LOGPROBS,
    NamedToolChoice,
    ResponseFormat,
    ToolChoice,
)
from router.service.engine_fields import (
    ROUTER_OWNED_FIELDS,
    engine_fields,
    finite,
    router_owned,
    unknown_field,
)
from router.service.input_limits import (
    BLOCK_ID_END,
    MAX_TEMPERATURE,
    TOKEN_ID_END,
    BlockId,
    InputLimits,
    TokenId,
    input_limits,
    over_limit,
    use_input_limits,
)
from router.service.instance_schemas import InstanceConfig, InstanceStatus, KVEventsBody
from router.service.openai_fields import refusal_of

__all__ = [
    "BLOCK_ID_END",
    "ERROR_RESPONSES",
    "TOKEN_ID_END",
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
    stop_token_ids: list[TokenId] | None = Field(
        None, description="Token IDs that end the generation (the router stops on them, "
        "and passes them on)",
    )  # fmt: skip

    REFUSED_AT_SOME_VALUES: ClassVar[frozenset[str]] = frozenset()
    """OpenAI fields of this endpoint accepted only at values the router honours anyway."""

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
        for key in self.REFUSED_AT_SOME_VALUES & extra.keys():
            why = refusal_of(key, extra[key])
            if why is not None:
                raise PydanticCustomError(
                    "unsupported", "{field}={value}: {why}",
                    {"field": key, "value": repr(extra[key])[:60], "why": why, "param": key},
                )  # fmt: skip
        name = router_owned(extra)
        if name is not None:
            raise PydanticCustomError(
                "router_owned", "{field} may not be set by a client: {why}",
                {"field": name, "why": ROUTER_OWNED_FIELDS[name], "param": name},
            )  # fmt: skip
        name = unknown_field(extra, self.REFUSED_AT_SOME_VALUES)
        if name is not None:
            raise PydanticCustomError(
                "unsupported", "{field} is not a field this router honours or passes on to "
                "its engines (docs/openai-fields.md lists those it does)",
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
        sampling and output fields; any other was refused), and the stop token IDs."""
        fields = engine_fields(self.model_extra or {})
        if self.stop_token_ids:
            fields["stop_token_ids"] = list(self.stop_token_ids)
        return fields


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
    logprobs: int | None = Field(
        None, ge=0, le=MAX_TOP_LOGPROBS, description="Each token's log probability and this "
        "many likeliest alternatives",
    )  # fmt: skip
    echo: StrictBool = Field(False, description="The prompt's text leads the answer")

    REFUSED_AT_SOME_VALUES: ClassVar[frozenset[str]] = frozenset({"best_of", "suffix"})

    @model_validator(mode="after")
    def _echo_without_logprobs(self) -> CompletionRequest:
        if self.echo and self.logprobs is not None:
            raise PydanticCustomError(
                "unsupported", "echo with logprobs would need the prompt's log probabilities, "
                "which are not asked of the engines: leave one of them out", {"param": "echo"},
            )  # fmt: skip
        return self


class ChatRequest(GenerationFields):
    """OpenAI's chat completion request."""

    messages: list[dict[str, Any]] = Field(
        min_length=1, description="The conversation: role and content (text or text parts)"
    )
    max_completion_tokens: int | None = Field(None, gt=0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = Field(
        None, description='"none", "auto" (the default with tools), "required", or '
        '{"type": "function", "function": {"name": ...}}',
    )  # fmt: skip
    parallel_tool_calls: StrictBool = True
    response_format: ResponseFormat | None = None
    logprobs: StrictBool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    reasoning_effort: str | None = Field(
        None, max_length=64, description="Handed to the chat template (reasoning_effort)"
    )
    safety_identifier: str | None = Field(None, description="Taken as user")
    prompt_cache_key: str | None = Field(
        None, max_length=256, description="The session id when no session_id or user"
    )
    add_generation_prompt: StrictBool = True
    chat_template: str | None = Field(
        None, description="The name of one of the model's chat templates, or a template of "
        "the request's own (refused unless the service allows request templates)",
    )  # fmt: skip
    chat_template_kwargs: dict[str, Any] | None = None

    REFUSED_AT_SOME_VALUES: ClassVar[frozenset[str]] = frozenset({
        "store", "metadata", "service_tier", "modalities", "audio", "prediction",
        "functions", "function_call", "moderation", "verbosity", "web_search_options",
        "prompt_cache_options", "prompt_cache_retention",
    })  # fmt: skip

    @field_validator("tools")
    @classmethod
    def _functions(cls, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for i, tool in enumerate(tools or []):
            function = tool.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            if tool.get("type") != "function" or not isinstance(name, str) or not name:
                raise PydanticCustomError(
                    "unsupported", 'tools[{i}] is not {{"type": "function", "function": '
                    '{{"name": ..., "parameters": {{...}}}}}}', {"i": i, "param": "tools"},
                )  # fmt: skip
        return tools

    @model_validator(mode="after")
    def _coherent(self) -> ChatRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise PydanticCustomError(
                "unsupported", "top_logprobs needs logprobs: true", {"param": "top_logprobs"}
            )
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice):
            names = [((t.get("function") or {}).get("name")) for t in self.tools or []]
            if choice.function.name not in names:
                raise PydanticCustomError(
                    "unsupported", "tool_choice names {name}, which is not among the tools",
                    {"name": repr(choice.function.name), "param": "tool_choice"},
                )  # fmt: skip
        if choice in ("required",) and not self.tools:
            raise PydanticCustomError(
                "unsupported", "tool_choice required needs tools", {"param": "tool_choice"}
            )
        return self

    def session(self) -> str | None:
        """The session the request belongs to (its cache-affinity key)."""
        return (self.session_id or self.user or self.safety_identifier
                or self.prompt_cache_key)  # fmt: skip


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
    logprobs: dict[str, Any] | None = None


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

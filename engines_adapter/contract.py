"""What the router needs from any engine: the adapter contract and its messages."""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "EngineAdapter",
    "EngineError",
    "EngineLoad",
    "ErrorCause",
    "Feature",
    "GenerateRequest",
    "KVEvent",
    "KVEventBatch",
    "PrefillResult",
    "StructuredOutput",
    "TokenDelta",
    "TokenLogprob",
]


ErrorCause = Literal["request", "instance", "unreachable", "busy"]
"""Whose fault an engine error is: ``request``: the engine refused this request (a 4xx
other than 408/425/429, a token outside the vocabulary), the client's error, never held
against the instance and pointless to retry elsewhere; ``instance``: the engine failed
(a 5xx, a timeout, a broken stream, an unusable answer), held against the instance,
another may serve; ``unreachable``: the connection failed, the instance is down;
``busy``: the engine is at capacity (HTTP 429), back-pressure rather than a fault: never
held against the instance, another may serve, or this one a moment later."""

_UNPRINTABLE = re.compile(r"[^\x20-\x7e]+")


class EngineError(Exception):
    """An engine refused, failed or timed out.

    ``str(error)`` is the whole story, for logs; ``public`` is what a client may be told:
    the engine's own reason for refusing a request (its error message, cleaned and cut
    short), or a generic line for a failure, never the engine's body verbatim.
    """

    def __init__(
        self,
        instance_id: str,
        message: str,
        *,
        cause: ErrorCause = "instance",
        reason: str | None = None,
    ) -> None:
        """``reason``: the engine's own words for a refused request, when it gave any."""
        super().__init__(f"{instance_id}: {message}")
        self.instance_id = instance_id
        self.cause: ErrorCause = cause
        self.public = _public(cause, reason if reason is not None else message)

    @property
    def retryable(self) -> bool:
        """Whether another instance may serve the request."""
        return self.cause != "request"

    @property
    def held_against_instance(self) -> bool:
        """Whether the error says something about the instance's health."""
        return self.cause not in ("request", "busy")


def _public(cause: ErrorCause, reason: str) -> str:
    if cause != "request":
        return {"instance": "the engine failed", "busy": "the engine is busy"}.get(
            cause, "the engine is unreachable"
        )
    cleaned = _UNPRINTABLE.sub(" ", reason).strip()
    return (
        f"the engine refused the request: {cleaned[:200]}"
        if cleaned
        else ("the engine refused the request")
    )


class StructuredOutput(BaseModel):
    """Output constrained to JSON: any JSON object, or one that ``json_schema`` describes.
    Each adapter writes it in its engine's own field."""

    model_config = ConfigDict(extra="forbid")

    json_schema: dict[str, Any] | None = None


class TokenLogprob(BaseModel):
    """A generated token's log probability and, when asked, the likeliest alternatives
    (token ID and log probability, likeliest first)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = Field(default_factory=list)


class GenerateRequest(BaseModel):
    """A generation on one engine: decode, or extend-decode (prompt + eager token IDs)."""

    model_config = ConfigDict(extra="forbid")

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int = Field(gt=0)
    temperature: float = 0.0
    ignore_eos: bool = False
    kv_transfer_params: dict[str, Any] | None = None  # from a prefill, for disaggregation
    logprobs: int | None = Field(
        None, ge=0, description="Each token's log probability with this many alternatives "
        "(None: none asked)",
    )  # fmt: skip
    structured: StructuredOutput | None = None
    sampling: dict[str, Any] = Field(
        default_factory=dict,
        description="Further sampling fields of OpenAI's API (top_p, seed, ...), passed to "
        "the engine as they came; the adapter's own fields win over them",
    )


class PrefillResult(BaseModel):
    """A prefill's outcome: the first token and what decode targets need to fetch the KV.

    ``first_token_id`` is None only when the engine hands the first token to the
    decode target instead of returning it (SGLang PD: the prefill finishes only once
    the decode side has joined its bootstrap room, and the decode stream starts with
    that token). ``target_kv_params`` holds one entry per decode target when each
    target needs its own (SGLang: one bootstrap room each); use ``params_for``.
    """

    request_id: str
    first_token_id: int | None
    cached_tokens: int | None = None  # prompt tokens the engine served from its prefix cache
    kv_transfer_params: dict[str, Any] | None = None
    target_kv_params: list[dict[str, Any]] = Field(default_factory=list)

    def params_for(self, target: int) -> dict[str, Any] | None:
        """The kv_transfer_params to send with the decode request of target ``target``."""
        if self.target_kv_params:
            return self.target_kv_params[target]
        return self.kv_transfer_params


class TokenDelta(BaseModel):
    """Tokens a streaming generation produced since the previous delta."""

    token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    cached_tokens: int | None = None  # reported once, when the engine says it (usage)
    logprobs: list[TokenLogprob] | None = None  # one per token ID, when the request asked


class EngineLoad(BaseModel):
    """Load and cache figures an engine reports (vLLM: /metrics)."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # 0..1
    prefix_cache_queries: float = 0.0  # cumulative tokens
    prefix_cache_hits: float = 0.0  # cumulative tokens
    block_size: int | None = None
    num_blocks: int | None = None
    # the engine's inter-token latency histogram, cumulative: its seconds and its gaps
    itl_sum_s: float = 0.0
    itl_count: float = 0.0


class KVEvent(BaseModel):
    """One KV-cache event in the engine's own hashes, with token IDs when stored."""

    type: str  # "BlockStored" | "BlockRemoved" | "AllBlocksCleared"
    block_hashes: list[int | str] = Field(default_factory=list)
    parent_block_hash: int | str | None = None
    token_ids: list[int] = Field(default_factory=list)
    block_size: int | None = None
    # vLLM's isolation keys of a stored run: the LoRA adapter's name, and per block the
    # extra keys it hashed (LoRA name, (mm identifier, offset) pairs, cache salt on the
    # first block of a prompt, prompt-embedding digests); None when not sent
    lora_name: str | None = None
    extra_keys: list[list[Any] | None] | None = None


class KVEventBatch(BaseModel):
    """A batch of events as an engine publishes it (timestamp, events, sequence number)."""

    instance_id: str
    timestamp: float
    sequence: int | None = None
    events: list[KVEvent]
    # Set by a subscriber that saw a sequence gap (or a publisher restart) before this
    # batch: events were lost, so the view of this instance is stale. The subscriber
    # then also puts an AllBlocksCleared first in ``events``, so that a consumer that
    # simply applies events in order resyncs (under-counting rather than over-counting).
    gap: bool = False
    missed: int = 0  # batches lost, when known (0 after a publisher restart)


Feature = Literal["logprobs", "structured_output"]
"""What an engine may or may not do for a request; an adapter lists those it does in
``features`` (an adapter without the attribute does neither)."""


class EngineAdapter(Protocol):
    """One engine instance as the orchestrator drives it."""

    instance_id: str

    async def prefill(self, request: GenerateRequest, *, targets: int = 1) -> PrefillResult:
        """Compute the prompt's KV and make it available to ``targets`` decode instances."""
        ...

    def generate(self, request: GenerateRequest) -> AsyncGenerator[TokenDelta, None]:
        """Stream tokens (decode; extend-decode when the prompt ends with eager tokens).

        Errors (EngineError) are raised while iterating, refusals on the first step.
        The last delta has ``finished`` set; after ``abort`` it is an empty delta with
        ``finish_reason="abort"``. A consumer that stops early closes the generator
        (``contextlib.aclosing``), which releases the request on the engine.
        """
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a running generation; unknown ids are ignored."""
        ...

    async def load(self) -> EngineLoad:
        """Current load and cumulative prefix-cache figures."""
        ...

    async def health(self) -> bool:
        """True when the engine answers and can serve."""
        ...

    def kv_events(self) -> AsyncGenerator[KVEventBatch, None]:
        """KV-cache events as they are published (never ends while the engine runs).

        A batch with ``gap`` set follows lost ones and starts with AllBlocksCleared.
        Raises EngineError when the adapter has no event source.
        """
        ...

    async def aclose(self) -> None:
        """Release connections and sockets."""
        ...

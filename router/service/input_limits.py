"""The configured bounds request bodies are checked against, and the token-ID types."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field, StrictInt
from pydantic_core import PydanticCustomError

from router.settings import ServiceSettings

__all__ = [
    "BLOCK_ID_END",
    "MAX_TEMPERATURE",
    "TOKEN_ID_END",
    "BlockId",
    "InputLimits",
    "TokenId",
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

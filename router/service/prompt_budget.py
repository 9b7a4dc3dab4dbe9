"""Sizes checked before work: a request's prompt text is counted, and refused over the
character limit, before anything is rendered or tokenized (tokenizing millions of
characters costs seconds and gigabytes before the token limit could refuse them); a text
within it that encodes to more tokens than the limit is refused by the tokenizer before
its IDs are built (``TooManyTokens``), with the same words as the token-ID check."""

from __future__ import annotations

from collections.abc import Mapping

from router.service.errors import ApiError
from router.tokenization.protocol import TooManyTokens

__all__ = ["check_prompt_chars", "over_token_limit", "text_chars"]


def text_chars(value: object) -> int:
    """Characters of every string in a JSON-like value: strings, mapping keys and
    values, list items, at any depth (walked without recursion)."""
    total = 0
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, Mapping):
            total += sum(len(k) for k in item if isinstance(k, str))
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return total


def check_prompt_chars(chars: int, limit: int, field: str) -> None:
    """400 naming ``field``, its size and the limit when ``chars`` is over ``limit``."""
    if chars > limit:
        raise ApiError(
            400, f"{field} holds {chars} characters of text, over the limit of {limit} "
            "characters (service.max_prompt_chars)", param=field,
        )  # fmt: skip


def over_token_limit(exc: TooManyTokens, field: str) -> ApiError:
    """The 400 for a text the tokenizer refused, naming ``field`` (as ``check_prompt``)."""
    return ApiError(400, f"{field} {exc}", param=field)

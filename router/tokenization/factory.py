"""Building a model's tokenizer (files, built-in, or the engine) from its settings."""

from __future__ import annotations

from pathlib import Path

import httpx

from router.tokenization.builtin import builtin_tokenizer_dir
from router.tokenization.engine import EngineTokenizer
from router.tokenization.hf import HFTokenizer
from router.tokenization.pool import AsyncTokenizer
from router.tokenization.prefix_cache import PrefixCache
from router.tokenization.protocol import AsyncTokenizerLike
from router.tokenization.settings import ModelSettings

__all__ = ["build_async_tokenizer", "load_tokenizer"]


def load_tokenizer(settings: ModelSettings, max_tokens: int | None = None) -> HFTokenizer:
    """The model's tokenizer from its files (``tokenizer_path``) or the built-in one; it
    refuses a text of more than ``max_tokens`` tokens (``TooManyTokens``)."""
    tok = settings.tokenizer
    if tok.builtin:
        path: str | Path = builtin_tokenizer_dir()
    elif tok.tokenizer_path is None:
        raise ValueError(f"model {settings.name!r} has no tokenizer files configured")
    else:
        path = tok.tokenizer_path
    return HFTokenizer.from_pretrained(path, name=settings.name, max_tokens=max_tokens)


def build_async_tokenizer(
    settings: ModelSettings,
    *,
    client: httpx.AsyncClient | None = None,
    engine_url: str | None = None,
    max_tokens: int | None = None,
) -> AsyncTokenizerLike:
    """An AsyncTokenizer over the model's files (refusing texts over ``max_tokens``), or,
    with ``tokenize_with_engine``, an EngineTokenizer asking ``engine_url`` through
    ``client`` (both then required). The caller closes an AsyncTokenizer (``aclose``)."""
    tok = settings.tokenizer
    if tok.tokenize_with_engine:
        if client is None or engine_url is None:
            raise ValueError(f"model {settings.name!r} tokenizes with an engine: give its URL")
        return EngineTokenizer(
            client, engine_url, model=settings.name, cache_entries=tok.engine_cache_entries,
            max_tokens=max_tokens,
        )  # fmt: skip
    cache = (
        PrefixCache(tok.prefix_cache_entries, tok.prefix_cache_bytes)
        if tok.prefix_cache_entries
        else None
    )
    return AsyncTokenizer(
        load_tokenizer(settings, max_tokens),
        pool_size=tok.pool_size,
        max_pending=tok.max_pending,
        prefix_cache=cache,
        verify_every=tok.verify_every,
    )

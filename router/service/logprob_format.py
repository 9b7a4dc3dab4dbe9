"""Log probabilities in OpenAI's shapes: chat's ``logprobs.content`` entries, and the
completions' ``tokens``/``token_logprobs``/``top_logprobs``/``text_offset`` lists. Each
token's text is decoded by the router (the engines give token IDs)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from engines_adapter.contract import TokenLogprob
from router.tokenization.protocol import AsyncTokenizerLike

__all__ = ["chat_logprobs", "completion_logprobs"]


async def _texts(
    tokenizer: AsyncTokenizerLike | None, entries: Sequence[TokenLogprob], top: int
) -> dict[int, str]:
    """Each token's own text (``token_id:N`` without a tokenizer)."""
    ids = {e.token_id for e in entries} | {t for e in entries for t, _ in e.top[:top]}
    order = sorted(ids)
    if tokenizer is None:
        return {i: f"token_id:{i}" for i in order}
    texts = await asyncio.gather(*(tokenizer.decode([i]) for i in order))
    return dict(zip(order, texts, strict=True))


def _finite(value: float) -> float:
    """JSON has no -inf: a token the engine gave no probability gets the lowest float."""
    return value if value > -1e300 else -9999.0


async def chat_logprobs(
    tokenizer: AsyncTokenizerLike | None, entries: Sequence[TokenLogprob], top: int
) -> dict[str, Any]:
    """``choices[].logprobs`` of a chat answer (or of a chunk's tokens)."""
    texts = await _texts(tokenizer, entries, top)

    def item(token: int, logprob: float) -> dict[str, Any]:
        text = texts[token]
        return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode())}

    content = [
        {**item(e.token_id, e.logprob), "top_logprobs": [item(t, v) for t, v in e.top[:top]]}
        for e in entries
    ]
    return {"content": content, "refusal": None}


async def completion_logprobs(
    tokenizer: AsyncTokenizerLike | None,
    entries: Sequence[TokenLogprob],
    top: int,
    offset: int = 0,
) -> dict[str, Any]:
    """``choices[].logprobs`` of a completion: ``text_offset`` counts from ``offset`` (the
    characters before the first token's text)."""
    texts = await _texts(tokenizer, entries, top)
    offsets, at = [], offset
    for entry in entries:
        offsets.append(at)
        at += len(texts[entry.token_id])
    return {
        "tokens": [texts[e.token_id] for e in entries],
        "token_logprobs": [_finite(e.logprob) for e in entries],
        "top_logprobs": [{texts[t]: _finite(v) for t, v in e.top[:top]} for e in entries]
        if top
        else None,
        "text_offset": offsets,
    }

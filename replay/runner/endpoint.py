"""What the commands that drive a live OpenAI-compatible endpoint share: a first check
that it answers, and the tokens a streamed completion chunk carries."""

from __future__ import annotations

from typing import Any

import httpx

from router.errors import UserError

__all__ = ["check_answers", "tokens_in_chunk"]


async def check_answers(client: httpx.AsyncClient, url: str) -> None:
    """Refuse at once an endpoint that does not answer (rather than N failed requests)."""
    try:
        await client.get(f"{url}/v1/models", timeout=10)
    except httpx.HTTPError as exc:
        raise UserError(f"{url} does not answer: {exc}") from None


def tokens_in_chunk(chunk: Any) -> int:
    """Tokens a streamed chunk carries: its token IDs when given, else one per non-empty
    text (engines stream about a token per chunk); 0 for anything else."""
    if not isinstance(chunk, dict):
        return 0
    count = 0
    for choice in chunk.get("choices") or ():
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            count += len(ids)
        elif choice.get("text"):
            count += 1
    return count

"""The vocabulary a live run draws its made-up token IDs from: the one given, else the
one the endpoint's card of the model gives (the router's cards do: ``vocab_size``),
else a guess the run warns about. Token IDs outside the model's vocabulary are refused
(the router: 400) or take an engine down."""

from __future__ import annotations

from typing import Any

import httpx

from replay.trace.token_synth import LOWEST_TOKEN
from router.errors import UserError

__all__ = ["DEFAULT_VOCAB", "live_vocabulary"]

DEFAULT_VOCAB = 32_000
"""Token IDs are drawn below this when neither ``--vocab-size`` nor the endpoint gives
the model's vocabulary (vLLM's model cards do not)."""


async def live_vocabulary(
    url: str, model: str | None, headers: dict[str, str], given: int | None
) -> tuple[int, str | None]:
    """The vocabulary, and a warning when it is a guess. An endpoint that does not
    answer is left to the run's first check to report."""
    if given is not None:
        return given, None
    cards: Any = None
    try:
        async with httpx.AsyncClient(headers=headers, timeout=10) as client:
            response = await client.get(f"{url}/v1/models")
        if response.status_code == 200:
            cards = response.json().get("data")
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    found = [c for c in cards if isinstance(c, dict)] if isinstance(cards, list) else []
    if model is not None:
        found = [c for c in found if c.get("id") == model]
    size = found[0].get("vocab_size") if len(found) == 1 else None
    if not isinstance(size, int) or isinstance(size, bool):
        return DEFAULT_VOCAB, (
            "the endpoint does not give the model's vocabulary: token IDs were drawn below "
            f"{DEFAULT_VOCAB} (give the model's with --vocab-size)"
        )
    if size <= LOWEST_TOKEN:
        raise UserError(
            f"the endpoint's model has a vocabulary of {size} tokens: too few to draw token "
            f"IDs from (IDs below {LOWEST_TOKEN} are left out)"
        )
    return size, None

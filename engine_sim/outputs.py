"""What the simulated engine answers beyond its toy model's tokens: log probabilities
(deterministic fake values) and structured output (a JSON value the schema accepts, as
text of its own tokenizer), so the demo shows both without a real model."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engines_adapter.contract import StructuredOutput, TokenLogprob

__all__ = ["TextEncoder", "fake_logprob", "forced_tokens", "sample_json"]

TextEncoder = Callable[[str], list[int]]
"""Text to the token IDs the engine's model would write for it."""

_MAX_DEPTH = 8


def fake_logprob(state: int, token: int, top: int, vocab_size: int) -> TokenLogprob:
    """The chosen token's log probability, a function of the model's state (so the same
    context gives the same value on any instance, across a handoff too), and ``top``
    likeliest tokens: the chosen one first, then others less likely."""
    logprob = -((state ^ token) % 997) / 1000.0 - 0.001
    alternatives = [(token, logprob)]
    for rank in range(1, top):
        other = (token + rank * 7919) % vocab_size
        if other != token:
            alternatives.append((other, logprob - rank * 0.5))
    return TokenLogprob(token_id=token, logprob=logprob, top=alternatives[:top])


def sample_json(schema: Mapping[str, Any] | None, depth: int = 0) -> Any:
    """A small JSON value that ``schema`` accepts (the common keywords: const, enum, type,
    properties, items, anyOf/oneOf/allOf); any object without a schema."""
    if schema is None:
        return {"answer": "demo"}
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return sample_json(schema[key][0], depth + 1)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = kind[0] if kind else "object"
    if depth > _MAX_DEPTH:
        return None
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: sample_json(sub, depth + 1) for name, sub in props.items()}
    if kind == "array":
        items = schema.get("items")
        count = max(int(schema.get("minItems", 1)), 1)
        return [sample_json(items if isinstance(items, Mapping) else {}, depth + 1)] * count
    return {"string": "demo", "integer": 1, "number": 1.5, "boolean": True}.get(kind)


def forced_tokens(
    structured: StructuredOutput, encode: TextEncoder, prompt: Sequence[int], eos: int | None
) -> tuple[list[int], int]:
    """The tokens of the structured answer (EOS last when the model has one), and how many
    of them the prompt already ends with: an extend-decode after a handoff continues where
    the first engine stopped (the longest such run is taken)."""
    text = json.dumps(sample_json(structured.json_schema), separators=(",", ": "))
    tokens = [*encode(text), *([] if eos is None else [eos])]
    for done in range(min(len(tokens), len(prompt)), 0, -1):
        if list(prompt[len(prompt) - done :]) == tokens[:done]:
            return tokens, done
    return tokens, 0

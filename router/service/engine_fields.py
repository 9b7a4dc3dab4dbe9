"""Which fields of a completion request a client may pass on to the engines.

A request's fields beyond the router's own schema are sorted three ways:

- ``CLIENT_ENGINE_FIELDS``: sampling and output-format fields of OpenAI's and vLLM's APIs
  (``top_p``, ``seed``, ``top_k``, ...), passed to the engine as they came;
- ``ROUTER_OWNED_FIELDS``: fields that steer an engine's scheduling, its KV transfer or
  its processing (``kv_transfer_params``, ``priority``, ``logits_processors``, ...),
  which the router sets itself or never: a request carrying one is refused (400);
- anything else is refused (400) with its name: a field the router neither honours
  nor passes on would otherwise be dropped without the client knowing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "CLIENT_ENGINE_FIELDS",
    "ROUTER_HONOURED_FIELDS",
    "ROUTER_OWNED_FIELDS",
    "engine_fields",
    "finite",
    "router_owned",
    "unknown_field",
]

CLIENT_ENGINE_FIELDS = frozenset({
    # OpenAI's sampling fields (its other fields the router honours itself:
    # openai_fields.py lists what it does with each)
    "top_p", "seed", "frequency_penalty", "presence_penalty", "logit_bias",
    # vLLM's extra sampling parameters
    "top_k", "min_p", "repetition_penalty", "length_penalty", "min_tokens",
    "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens",
    "spaces_between_special_tokens", "bad_words", "allowed_token_ids",
    # vLLM's structured outputs
    "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "guided_whitespace_pattern",
})  # fmt: skip
"""Fields a client may set that the engine honours as it would from any client."""

ROUTER_OWNED_FIELDS: Mapping[str, str] = {
    "kv_transfer_params": "the router sets it for its own prefill-to-decode handoffs",
    "priority": "the engine's scheduling order is the router's to set",
    "logits_processors": "it runs code of the engine's choosing on every token",
    "vllm_xargs": "it passes arguments to the engine's custom processors",
    "request_id": "the router names each engine request itself",
    "data_parallel_rank": "it pins the request to one of the engine's ranks",
    "truncate_prompt_tokens": "the router decided on the whole prompt",
    "return_tokens_as_token_ids": "the router decodes the tokens itself",
    "prompt_token_ids": "the prompt is the request's prompt or messages",
    "lora_request": "adapters are chosen by the configured model",
    "mm_processor_kwargs": "the engine's processor settings are the operator's",
    "bootstrap_host": "the router sets it for its own prefill-to-decode handoffs",
    "bootstrap_port": "the router sets it for its own prefill-to-decode handoffs",
    "bootstrap_room": "the router sets it for its own prefill-to-decode handoffs",
    "disaggregated_params": "the router sets it for its own prefill-to-decode handoffs",
    "custom_logit_processor": "it runs code of the client's choosing in the engine",
    "rid": "the router names each engine request itself",
}
"""Fields that steer an engine or the router's handoffs, with why a client may not."""


ROUTER_HONOURED_FIELDS = frozenset({"return_token_ids"})
"""Fields the router honours itself and does not pass on: its answers always carry the
token IDs (``choices[].token_ids``)."""


def router_owned(extra: Mapping[str, Any]) -> str | None:
    """The first router-owned field among a request's extra fields (None: none is)."""
    return next((name for name in extra if name in ROUTER_OWNED_FIELDS), None)


def unknown_field(extra: Mapping[str, Any], honoured: frozenset[str] = frozenset()) -> str | None:
    """The first extra field that is neither passed on, router-owned nor among
    ``honoured`` (None: none)."""
    return next(
        (
            n
            for n in extra
            if n not in CLIENT_ENGINE_FIELDS
            and n not in ROUTER_OWNED_FIELDS
            and n not in ROUTER_HONOURED_FIELDS
            and n not in honoured
        ),
        None,
    )


def engine_fields(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The extra fields that go on to the engine: the allowlisted ones only."""
    return {k: v for k, v in extra.items() if k in CLIENT_ENGINE_FIELDS}


def finite(value: object) -> bool:
    """No float in ``value`` (at any depth of lists and mappings) is NaN or infinite."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return False
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return True

"""The bodies of the admin API's instances and of pushed KV events."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, field_validator

from policies.tiers import Tier
from router.kv_relay.settings import INSTANCE_ID

__all__ = ["InstanceConfig", "InstanceStatus", "KVEventsBody"]


class InstanceConfig(BaseModel):
    """An engine instance the router drives."""

    model_config = ConfigDict(extra="forbid")

    instance_id: str = Field(pattern=rf"^{INSTANCE_ID.pattern}$")
    tier: Tier
    datacenter: str = Field("A", min_length=1, max_length=64)
    url: str = Field("inproc://", description="Engine base URL; inproc:// for a built-in sim")
    adapter: Literal["sim", "vllm", "sglang"] = "vllm"
    capacity_tokens: StrictInt = Field(1_000_000, gt=0, description="KV capacity in tokens")
    max_batch: StrictInt = Field(256, gt=0)
    kv_events_endpoint: str | None = Field(None, description="ZMQ endpoint of KV events")
    model: str | None = Field(
        None, max_length=256, description="The model name it serves (OpenAI's `model`): a "
        "request for a model goes only to its instances; none: the unnamed default model",
    )  # fmt: skip

    @field_validator("url")
    @classmethod
    def _engine_url(cls, url: str) -> str:
        """http(s) with a host, or inproc:// (the built-in sim): the router sends prompts there."""
        from urllib.parse import urlsplit

        if url == "inproc://":
            return url
        parts = urlsplit(url)
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host (inproc:// for sim)")
        _ = parts.port  # ValueError when the port is not a number in range
        return url


class InstanceStatus(InstanceConfig):
    healthy: bool
    running: int
    queued: int
    indexed_blocks: int


class KVEventsBody(BaseModel):
    """A batch of KV events in vLLM's schema (events as maps or positional arrays).

    Bounds (400 naming the value beyond them): at most ``service.max_kv_events_per_batch``
    events, at most ``service.max_kv_event_tokens`` token IDs per event, each in
    [0, 2**63) and below ``service.vocab_size`` when set; integer block hashes in the
    signed or unsigned 64-bit range.
    """

    model_config = ConfigDict(strict=True)

    instance_id: str
    timestamp: StrictFloat = Field(0.0, allow_inf_nan=False)
    events: list[dict[str, Any] | list[Any]] = Field(
        description='Maps ({"type": "BlockStored", "block_hashes": [...], "parent_block_hash": '
        '..., "token_ids": [...], "block_size": 16}) or tagged arrays (["BlockStored", '
        "block_hashes, parent_block_hash, token_ids, block_size, ...])"
    )

"""Settings of the KV relay (``pdd-router kv-relay``) and of a router subscribing to one."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "INSTANCE_ID",
    "MAX_BATCH_BLOCKS",
    "KVRelaySettings",
    "KVRelaySource",
    "check_endpoint",
]

_TCP = re.compile(r"^tcp://(?P<host>\*|[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>\*|\d{1,5})$")
INSTANCE_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
"""What an instance id may be (use ``fullmatch``); an instance config holds to it too."""
MAX_BATCH_BLOCKS = 65_536
"""The most blocks one relayed batch carries by default: a relay splits larger ones, a
receiver refuses them unread."""


def check_endpoint(endpoint: str) -> str:
    """A ZMQ endpoint this project binds or connects: tcp://HOST:PORT (``*`` for any
    interface, or for a port the system picks when binding), ipc://PATH or inproc://NAME;
    ValueError saying what is wrong otherwise."""
    if endpoint.startswith(("ipc://", "inproc://")) and len(endpoint.split("://", 1)[1]) > 0:
        return endpoint
    found = _TCP.match(endpoint)
    if found is None:
        raise ValueError("must be tcp://HOST:PORT (or ipc://PATH, inproc://NAME)")
    port = found.group("port")
    if port != "*" and not 0 < int(port) <= 65535:
        raise ValueError(f"port {port} is not in 1-65535")
    return endpoint


class KVRelaySource(BaseModel):
    """A KV relay a router subscribes to instead of to the instances it covers: their
    events reach the router from it, compact, and their own kv_events_endpoint is not used."""

    model_config = ConfigDict(extra="forbid")

    endpoint: str = Field(description="The relay's publish endpoint, as seen from here")
    replay_endpoint: str | None = Field(None, description="The relay's replay endpoint")
    instances: list[str] = Field(
        min_length=1, description="The instances whose KV events come from this relay"
    )

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _endpoint(cls, endpoint: str | None) -> str | None:
        if endpoint is None:
            return None
        if ":*" in endpoint:
            raise ValueError("a relay to connect to needs its port, not *")
        return check_endpoint(endpoint)

    @field_validator("instances")
    @classmethod
    def _instance_ids(cls, ids: list[str]) -> list[str]:
        bad = [i for i in ids if not INSTANCE_ID.fullmatch(i)]
        if bad:
            raise ValueError(f"not an instance id: {bad[0]!r:.80}")
        if len(set(ids)) != len(ids):
            raise ValueError("an instance is listed twice")
        return ids


class KVRelaySettings(BaseModel):
    """``pdd-router kv-relay``: runs beside a datacenter's engines, subscribes to their KV
    events, re-hashes them under the router's chain hash (``block_size`` and ``hash_seed``
    must be the routers') and publishes one compact stream for the other datacenter."""

    model_config = ConfigDict(extra="forbid")

    instances_file: str | None = Field(
        None, description="YAML or JSON list of instances (the `serve` format); the relay "
        "subscribes to the kv_events_endpoint of those of its datacenter",
    )  # fmt: skip
    datacenter: str | None = Field(
        None, min_length=1, max_length=64, description="Relay only the instances of this "
        "datacenter (none: every instance of the file with a KV-event endpoint)",
    )  # fmt: skip
    publish_endpoint: str = Field(
        "tcp://*:5600", description="ZMQ PUB address the compact stream is published on"
    )
    replay_endpoint: str | None = Field(
        "tcp://*:5601", description="ZMQ ROUTER address serving the last batches again to a "
        "subscriber that missed some (none: no replay; a gap then clears the instances)",
    )  # fmt: skip
    batch_window_s: float = Field(
        0.002, ge=0, le=10, description="How long events wait for others to share their batch "
        "(the staleness the relay adds at most, besides the line)",
    )  # fmt: skip
    max_batch_blocks: int = Field(
        MAX_BATCH_BLOCKS, gt=0, description="A batch holding this many blocks goes out at "
        "once, and none holds more (more pending are split over several); a batch of an "
        "upstream relay holding more is refused",
    )  # fmt: skip
    buffer_batches: int = Field(
        10_000, gt=0, description="Batches kept for replay (the oldest are dropped)"
    )
    upstream: list[KVRelaySource] = Field(
        default_factory=list, description="Relays of the other datacenter to forward: run "
        "one relay in A subscribed to B's across the line, and A's router replicas subscribed "
        "to it, so the line carries B's events once whatever the number of replicas",
    )  # fmt: skip

    @field_validator("publish_endpoint", "replay_endpoint")
    @classmethod
    def _endpoint(cls, endpoint: str | None) -> str | None:
        return None if endpoint is None else check_endpoint(endpoint)

    @model_validator(mode="after")
    def _distinct(self) -> KVRelaySettings:
        if self.replay_endpoint is not None and self.replay_endpoint == self.publish_endpoint:
            raise ValueError("replay_endpoint must differ from publish_endpoint")
        return self

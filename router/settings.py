"""The one settings class: env prefix PDD_ROUTER_, nested with __, optional YAML file."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    IPvAnyNetwork,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from router.kv_relay.settings import MAX_BATCH_BLOCKS, KVRelaySettings, KVRelaySource
from router.service.connection_settings import ConnectionSettings
from router.sla import SLA_TPOT_S, SLA_TTFT_S
from router.tokenization.settings import ModelSettings, RequestTemplateSettings

__all__ = [
    "ClusterSettings",
    "IndexSettings",
    "PolicySettings",
    "RedisSettings",
    "ReplicaSettings",
    "ServiceSettings",
    "Settings",
    "settings_errors",
]

CONFIG_FILE_ENV = "PDD_ROUTER_CONFIG"


class RedisSettings(BaseModel):
    """Where the shared prefix index lives when several router replicas share one."""

    model_config = ConfigDict(hide_input_in_errors=True)  # a URL may hold a password

    url: str = Field(
        "redis://127.0.0.1:6379/0", description="The Redis of the shared index: one server, "
        "redis://[[user]:password@]host:port/db (rediss:// with TLS, unix:///path.sock), or "
        "a primary that Redis Sentinel watches, redis+sentinel://[[user]:password@]"
        "host:port[,host:port...]/service_name[/db] (sentinel port 26379 and db 0 when "
        "omitted; the password is the primary's, the sentinels are asked without one). "
        "Through Sentinel every new connection asks the sentinels for the current primary, "
        "so after a failover the router writes to the promoted replica. Or a Redis Cluster, "
        "redis+cluster://[[user]:password@]host:port[,host:port...] (some nodes; the index "
        "keeps its keys in the one slot of its key prefix's hash tag, so run one key prefix "
        "per model to spread models over the cluster)",
    )  # fmt: skip
    key_prefix: str = Field("pdd", description="Namespace of every key the index writes")
    socket_timeout_s: float = Field(
        0.25, gt=0, description="Longest wait for one Redis reply: a hung Redis stalls a "
        "decision this long, then the router's local mirror answers",
    )  # fmt: skip
    connect_timeout_s: float = Field(0.25, gt=0, description="Longest wait to connect")
    retries: int = Field(
        3, ge=0, description="Retries with backoff on connection errors (not on timeouts)"
    )
    retry_after_s: float = Field(
        1.0, gt=0, description="While Redis is unreachable, how often it is tried again"
    )
    verify_every_s: float = Field(
        1.0, gt=0, description="How often the router checks that Redis still holds its "
        "state (a restart without persistence empties it; the router then writes it back)",
    )  # fmt: skip
    recovery_step_s: float = Field(
        0.05, gt=0, description="Time one index call may spend writing the router's state "
        "back to Redis after an outage or a restart",
    )  # fmt: skip

    @field_validator("url")
    @classmethod
    def _known_url(cls, url: str) -> str:
        """A Sentinel or cluster URL (or an unknown scheme) is checked now, a one-server URL
        by redis-py when the index connects."""
        if not url.startswith(("redis://", "rediss://", "unix://")):
            from router.index.redis_connect import parse_redis_url

            parse_redis_url(url)  # ValueError saying what is wrong, never with the password
        return url


class ReplicaSettings(BaseModel):
    """Several `serve` replicas on one Redis (the Redis index, same key prefix)."""

    share: bool = Field(
        True, description="With the Redis index: publish this replica's in-flight load per "
        "instance and read the others' before each decision, and write each instance's KV "
        "events to Redis from one replica only (a lease); false: act alone",
    )  # fmt: skip
    replica_id: str | None = Field(
        None, description="This replica's name among the others (default: host, process id "
        "and a random suffix)",
    )  # fmt: skip
    ttl_s: float = Field(
        3.0, gt=0, description="A replica silent this long is gone: its load stops counting "
        "and its KV-event leases pass to the others",
    )  # fmt: skip
    heartbeat_s: float = Field(
        0.5, gt=0, description="How often a replica renews its leases and exchanges load "
        "while it decides nothing (under ttl_s)",
    )  # fmt: skip

    @model_validator(mode="after")
    def _heartbeat_within_ttl(self) -> ReplicaSettings:
        if self.heartbeat_s >= self.ttl_s:
            raise ValueError(
                f"heartbeat_s ({self.heartbeat_s:g}) must be under ttl_s ({self.ttl_s:g}), "
                "or replicas' leases lapse between heartbeats"
            )
        return self


class IndexSettings(BaseModel):
    """The prefix index: embedded in memory by default, Redis when shared."""

    backend: Literal["memory", "redis"] = "memory"
    capacity_blocks: int | None = Field(
        1_000_000, gt=0, description="Default per-instance capacity in blocks (LRU beyond it)"
    )
    ttl_s: float | None = Field(None, gt=0, description="Forget blocks not touched for this long")


CHARS_PER_TOKEN_BOUND = 16
"""Characters per token no real tokenizer exceeds on ordinary text (about 4 is typical):
the prompt character limit derived from the token limit."""


class ServiceSettings(BaseModel):
    """The HTTP service."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_key: str | None = Field(
        None, description="The client key: when set, required on the client API "
        "(completions, chat, route, models); the admin key too unless admin_key is set",
    )  # fmt: skip
    admin_key: str | None = Field(
        None, description="The admin key: required on the admin API (instances, KV events, "
        "experiments), accepted everywhere; with it, api_key opens the client API only",
    )  # fmt: skip
    metrics_key: str | None = Field(
        None, description="A key accepted on /metrics only (for scrapers), besides the "
        "admin key",
    )  # fmt: skip
    allow_unauthenticated_admin: bool = Field(
        False, description="With no admin key (admin_key, or api_key alone), accept admin "
        "writes (instances, KV events, experiments) from anyone; refused with 403 otherwise",
    )  # fmt: skip
    show_shared_predictions: bool = Field(
        False, description="Show predicted hits (and the WAN, TTFT and reason that follow "
        "from them) to requests without a cache_salt, whose prefixes every such request "
        "shares; off, only a request with a cache_salt sees them, over its own salt's blocks",
    )  # fmt: skip
    instance_networks: list[IPvAnyNetwork] = Field(
        default_factory=list, description="CIDRs that instances registered over the API "
        "must resolve into (empty: any address)",
    )  # fmt: skip
    max_body_bytes: int = Field(8 * 1024 * 1024, gt=0, description="Larger bodies get 413")
    connections: ConnectionSettings = ConnectionSettings()
    max_prompt_tokens: int = Field(131_072, gt=0, description="Longer prompts get 400")
    max_prompt_chars: int | None = Field(
        None, gt=0, description="More characters of text in a request's prompt (a chat's "
        "messages, tools and template arguments; a completion's texts) get 400 before anything "
        "is rendered or tokenized (None: 16 x max_prompt_tokens)",
    )  # fmt: skip
    request_templates: RequestTemplateSettings = RequestTemplateSettings()
    max_hash_ids: int = Field(
        131_072, gt=0, description="More block IDs in one /v1/route request get 400"
    )
    max_kv_events_per_batch: int = Field(
        100_000, gt=0, description="More events in one POST /v1/kv-events batch get 400"
    )
    max_kv_event_tokens: int = Field(
        131_072, gt=0, description="More token IDs in one posted KV event get 400"
    )
    vocab_size: int | None = Field(None, gt=0, description="Token IDs at or above it get 400")
    max_tokens_default: int = Field(256, gt=0, description="max_tokens when a request omits it")
    max_tokens_limit: int = Field(32_768, gt=0, description="Larger max_tokens get 400")
    engine_timeout_s: float = Field(
        30.0, gt=0, description="Longest wait for an engine's first token (a prefill, or the "
        "first token of a stream); then the instance counts a failure and the request is "
        "decided again elsewhere",
    )  # fmt: skip
    route_fast_path: bool = Field(
        True, description="Answer ordinary POST /v1/route requests straight from ASGI (the "
        "same decision, without the framework's per-request work); false: always the endpoint",
    )  # fmt: skip
    engine_inter_token_timeout_s: float = Field(
        15.0, gt=0, description="Longest wait between two tokens of a stream"
    )
    ejected_stream_grace_s: float = Field(
        1.0, ge=0, description="Once an instance is taken out of service (its circuit breaker "
        "opens), how long a stream it is serving waits for its next token before it ends "
        "with an error event (a stream that has not sent its first token yet is decided "
        "again elsewhere at once)",
    )  # fmt: skip
    engine_connect_timeout_s: float = Field(2.0, gt=0, description="Connecting to an engine")
    probe_timeout_s: float = Field(
        1.0, gt=0, description="Longest wait for an engine's health and load answer"
    )
    breaker_failures: int = Field(
        3, ge=1, description="Failures in a row (timeouts, 5xx, failed probes) that take an "
        "instance out of service; a refused connection takes it out at once",
    )  # fmt: skip
    breaker_open_s: float = Field(
        2.0, gt=0, description="How long an instance stays out before a successful probe lets "
        "requests try it again (doubled after each failed try, up to 30 s)",
    )  # fmt: skip
    load_poll_s: float = Field(1.0, gt=0, description="How often engines' load is read")
    instances_file: str | None = Field(None, description="YAML or JSON list of instances")
    predictor_model: str | None = Field(
        None, description="A model from `predictor train`: decisions use predicted hits"
    )
    decision_log: str | None = Field(
        None,
        description="Append each decision and each finished request's outcome to this file "
        "as JSON lines (the replay's decision-log format: `predictor train` reads it)",
    )
    approximate_index: bool = Field(
        False, description="Record where requests were routed in the index (no KV events)"
    )
    kv_events_grace_s: float = Field(
        0.5, ge=0, description="With a decision log: how long an outcome whose hit is read "
        "from KV events waits for the request's last stored events after it ends",
    )  # fmt: skip
    experiment_samples: int = Field(
        50_000, gt=0, description="Outcomes each arm of an online experiment keeps for its "
        "figures (TTFT, TPOT, SLA attainment, prediction error): beyond, a uniform sample of "
        "the arm's requests; its request count and pipeline mix stay exact",
    )  # fmt: skip
    experiments_kept: int = Field(
        20, ge=0, description="Stopped experiments whose reports stay available; stopping "
        "one more forgets the oldest",
    )  # fmt: skip
    sla_ttft_s: float = Field(SLA_TTFT_S, gt=0, description="SLA on time to first token")
    sla_tpot_s: float = Field(SLA_TPOT_S, gt=0, description="SLA on time per output token")
    max_kv_relay_batch_blocks: int = Field(
        MAX_BATCH_BLOCKS, gt=0, description="A batch from a KV relay carrying more blocks is "
        "refused unread (logged; the relay's instances are cleared as after a gap); a relay "
        "splits its batches to its own max_batch_blocks, the same by default",
    )  # fmt: skip
    kv_relays: list[KVRelaySource] = Field(
        default_factory=list, description="KV relays (`pdd-router kv-relay`) in the other "
        "datacenter: the KV events of the instances each one lists come from it, compact, "
        "once, instead of from each instance's own endpoint",
    )  # fmt: skip

    @property
    def prompt_char_limit(self) -> int:
        """Characters of prompt text a request may carry (``max_prompt_chars``, or a
        generous 16 characters per token of ``max_prompt_tokens``)."""
        if self.max_prompt_chars is not None:
            return self.max_prompt_chars
        return CHARS_PER_TOKEN_BOUND * self.max_prompt_tokens

    @model_validator(mode="after")
    def _one_relay_per_instance(self) -> ServiceSettings:
        seen: set[str] = set()
        for source in self.kv_relays:
            twice = seen.intersection(source.instances)
            if twice:
                raise ValueError(f"instance {sorted(twice)[0]!r} is listed by two KV relays")
            seen.update(source.instances)
        return self


class ClusterSettings(BaseModel):
    """What the router assumes about the deployment when it predicts."""

    wan_gbps: float = Field(20.0, gt=0)
    wan_rtt_s: float = Field(0.03, ge=0)
    rdma_gbps: float = Field(400.0, gt=0)
    rdma_rtt_s: float = Field(1e-5, ge=0)
    kv_bytes_per_token: float = Field(70_000.0, gt=0)
    prefill_tokens_per_s: float = Field(20_000.0, gt=0, description="One P instance")
    decode_step_s: float = Field(0.03, gt=0, description="A typical MD decode step")


class PolicySettings(BaseModel):
    """The policy the service decides with: a registered name and its parameters."""

    name: str = Field(
        "pdd-adaptive", description="Registered policy; pdd-adaptive refuses requests past "
        "the cluster's capacity (429 with Retry-After) instead of queueing them",
    )  # fmt: skip
    params: dict[str, object] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_policy(self) -> PolicySettings:
        """A wrong name or parameter is refused with the settings, naming it."""
        from policies.registry import UnknownPolicyError, parse_policy

        try:
            parse_policy(self.name, self.params)
        except UnknownPolicyError as exc:
            raise ValueError(str(exc)) from None
        return self


class Settings(BaseSettings):
    """Every setting of pdd-router, from (highest first) arguments, env, YAML file, defaults."""

    model_config = SettingsConfigDict(
        env_prefix="PDD_ROUTER_", env_nested_delimiter="__", extra="forbid",
        hide_input_in_errors=True,  # redis.url may hold a password: settings_errors shows it hidden
    )  # fmt: skip

    block_size: int = Field(16, gt=0, description="Tokens per KV block for live hashing")
    hash_seed: int = Field(0, ge=0, description="Seed of the chained block hash")
    index: IndexSettings = IndexSettings()
    redis: RedisSettings = RedisSettings()
    replicas: ReplicaSettings = ReplicaSettings()
    service: ServiceSettings = ServiceSettings()
    cluster: ClusterSettings = ClusterSettings()
    policy: PolicySettings = PolicySettings()
    relay: KVRelaySettings = KVRelaySettings()
    models: list[ModelSettings] = Field(
        default_factory=list,
        description="Served model names with their tokenizers (chat and text requests need "
        "one); an instance serves the model its config names",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get(CONFIG_FILE_ENV)
        if config_file:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config_file))
        return tuple(sources)


def settings_errors(exc: ValidationError) -> str:
    """A settings validation error on one line, naming each bad setting by its variable
    (a URL's password is not shown)."""
    parts = []
    for error in exc.errors():
        path = "__".join(str(part) for part in error["loc"]).upper()
        given = error.get("input")
        if isinstance(given, str) and "://" in given:
            from router.index.redis_connect import redact_url

            given = redact_url(given)
        parts.append(f"PDD_ROUTER_{path}: {error['msg']} (got {given!r})")
    return "; ".join(parts)

"""The one settings class: env prefix PDD_ROUTER_, nested with __, optional YAML file."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

__all__ = ["IndexSettings", "RedisSettings", "Settings"]

CONFIG_FILE_ENV = "PDD_ROUTER_CONFIG"


class RedisSettings(BaseModel):
    """Where the shared prefix index lives when several router replicas share one."""

    url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = Field("pdd", description="Namespace of every key the index writes")
    socket_timeout_s: float = Field(1.0, gt=0)
    retries: int = Field(3, ge=0, description="Retries with backoff on connection errors")


class IndexSettings(BaseModel):
    """The prefix index: embedded in memory by default, Redis when shared."""

    backend: Literal["memory", "redis"] = "memory"
    capacity_blocks: int | None = Field(
        1_000_000, gt=0, description="Default per-instance capacity in blocks (LRU beyond it)"
    )
    ttl_s: float | None = Field(None, gt=0, description="Forget blocks not touched for this long")


class Settings(BaseSettings):
    """Every setting of pdd-router, from (highest first) arguments, env, YAML file, defaults."""

    model_config = SettingsConfigDict(
        env_prefix="PDD_ROUTER_", env_nested_delimiter="__", extra="forbid"
    )

    block_size: int = Field(16, gt=0, description="Tokens per KV block for live hashing")
    hash_seed: int = Field(0, ge=0, description="Seed of the chained block hash")
    index: IndexSettings = IndexSettings()
    redis: RedisSettings = RedisSettings()

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

"""Build the configured prefix index: embedded in memory, or shared through Redis."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from router.index.base import Clock, PrefixIndex
from router.settings import IndexSettings, RedisSettings

if TYPE_CHECKING:
    from router.index.resilient_index import ResilientIndex

__all__ = ["build_index", "build_resilient_index"]


def build_index(
    settings: IndexSettings, redis: RedisSettings, clock: Clock | None = None
) -> PrefixIndex:
    """The index ``settings.backend`` names; ``clock`` defaults to monotonic (memory) or wall
    time (Redis, shared by several processes). An unreachable Redis raises a UserError."""
    if settings.backend == "memory":
        from router.index.memory_index import MemoryPrefixIndex

        return MemoryPrefixIndex(
            default_capacity_blocks=settings.capacity_blocks,
            ttl_s=settings.ttl_s,
            clock=time.monotonic if clock is None else clock,
        )
    from router.index.redis_index import RedisPrefixIndex

    return RedisPrefixIndex(
        redis.url,
        key_prefix=redis.key_prefix,
        default_capacity_blocks=settings.capacity_blocks,
        ttl_s=settings.ttl_s,
        clock=time.time if clock is None else clock,
        socket_timeout_s=redis.socket_timeout_s,
        connect_timeout_s=redis.connect_timeout_s,
        retries=redis.retries,
    )


def build_resilient_index(
    shared: PrefixIndex,
    settings: IndexSettings,
    redis: RedisSettings,
    on_state_change: Callable[[bool], None] | None = None,
) -> ResilientIndex:
    """``shared`` behind a local mirror that answers through outages and writes the
    router's state back after Redis restarts empty; ``on_state_change`` hears
    ``degraded`` change."""
    from router.index.resilient_index import ResilientIndex

    return ResilientIndex(
        shared,
        default_capacity_blocks=settings.capacity_blocks,
        ttl_s=settings.ttl_s,
        retry_after_s=redis.retry_after_s,
        verify_every_s=redis.verify_every_s,
        step_s=redis.recovery_step_s,
        on_state_change=on_state_change,
    )

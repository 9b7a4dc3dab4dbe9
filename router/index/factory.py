"""Build the configured prefix index: embedded in memory, or shared through Redis."""

from __future__ import annotations

import time

from router.index.base import Clock, PrefixIndex
from router.settings import IndexSettings, RedisSettings

__all__ = ["build_index"]


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
        retries=redis.retries,
    )

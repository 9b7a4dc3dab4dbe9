"""Shared fixtures of the prefix-index contract: one factory per implementation.

Redis-backed indexes get a unique key prefix per test and delete their keys at the
end (never FLUSHALL / FLUSHDB: the server may be shared). The real server comes from
PDD_ROUTER_TEST_REDIS_URL (default redis://127.0.0.1:6379/0); tests that need it are
marked ``redis`` and skipped when it does not answer.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import fakeredis
import pytest
import redis

from router.index.base import Clock, PrefixIndex
from router.index.memory_index import MemoryPrefixIndex
from router.index.redis_index import RedisPrefixIndex

REDIS_URL = os.environ.get("PDD_ROUTER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

BACKENDS = ["memory", pytest.param("redis", marks=pytest.mark.redis), "fakeredis"]

IndexFactory = Callable[..., PrefixIndex]


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def unique_prefix() -> str:
    return f"pdd-test:{uuid.uuid4().hex}"


_reachable: bool | None = None


def require_redis() -> str:
    """The test server's URL; skips the test when it does not answer."""
    global _reachable
    if _reachable is None:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1.0)
        try:
            _reachable = bool(client.ping())
        except redis.RedisError:
            _reachable = False
        finally:
            client.close()
    if not _reachable:
        pytest.skip(f"no redis-server at {REDIS_URL} (run scripts/ensure-redis.sh)")
    return REDIS_URL


def delete_prefix(client: Any, prefix: str) -> None:
    """Delete every key under ``prefix`` (SCAN + DEL)."""
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])


class RedisKeys:
    """A unique key prefix on the real server, and the keys left under it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.prefix = unique_prefix()
        self.client = redis.Redis.from_url(url)

    def keys(self, pattern: str = "*") -> list[str]:
        return sorted(
            k.decode() for k in self.client.scan_iter(match=f"{self.prefix}:{pattern}", count=1000)
        )

    def cleanup(self) -> None:
        delete_prefix(self.client, self.prefix)
        self.client.close()


@pytest.fixture
def redis_keys() -> Iterator[RedisKeys]:
    """A unique prefix on the real Redis, deleted after the test."""
    keys = RedisKeys(require_redis())
    yield keys
    keys.cleanup()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _factory(backend: str) -> tuple[IndexFactory, Callable[[], None]]:
    """An index factory for ``backend`` (every index it makes shares one store) and its cleanup."""
    if backend == "memory":

        def make_memory(
            default_capacity_blocks: int | None = None,
            ttl_s: float | None = None,
            clock: Clock | None = None,
        ) -> PrefixIndex:
            if clock is None:
                return MemoryPrefixIndex(default_capacity_blocks, ttl_s)
            return MemoryPrefixIndex(default_capacity_blocks, ttl_s, clock)

        return make_memory, lambda: None

    prefix = unique_prefix()
    made: list[RedisPrefixIndex] = []
    if backend == "redis":
        url = require_redis()
        admin: Any = redis.Redis.from_url(url)

        def client() -> Any:
            return None  # each index opens its own connection from the URL

    else:
        url = "redis://fakeredis.invalid:6379/0"
        server = fakeredis.FakeServer()
        admin = fakeredis.FakeRedis(server=server)

        def client() -> Any:
            return fakeredis.FakeRedis(server=server)

    def make_redis(
        default_capacity_blocks: int | None = None,
        ttl_s: float | None = None,
        clock: Clock | None = None,
    ) -> PrefixIndex:
        index = RedisPrefixIndex(
            url,
            key_prefix=prefix,
            default_capacity_blocks=default_capacity_blocks,
            ttl_s=ttl_s,
            client=client(),
            clock=time.time if clock is None else clock,
        )
        made.append(index)
        return index

    def cleanup() -> None:
        delete_prefix(admin, prefix)
        admin.close()
        for index in made:
            index.close()

    return make_redis, cleanup


@pytest.fixture
def backend_factory() -> Callable[[str], tuple[IndexFactory, Callable[[], None]]]:
    """``backend -> (make_index, cleanup)``, for tests that make stores themselves (hypothesis)."""
    return _factory


@pytest.fixture
def fake_clock_type() -> type[FakeClock]:
    return FakeClock


@pytest.fixture
def redis_url() -> str:
    """The real test server's URL (the test is skipped when it does not answer)."""
    return require_redis()


@pytest.fixture(params=BACKENDS)
def make_index(request: pytest.FixtureRequest) -> Iterator[IndexFactory]:
    """``make_index(default_capacity_blocks=None, ttl_s=None, clock=None)`` for each backend."""
    factory, cleanup = _factory(request.param)
    yield factory
    cleanup()

"""The asyncio Redis index uses the same keys, and gives the same answers, as the sync one."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import fakeredis
import pytest
import redis

from policies.tiers import Tier
from router.errors import UserError
from router.index.async_redis_index import AsyncRedisPrefixIndex
from router.index.base import IndexedInstance, UnknownInstanceError
from router.index.redis_index import RedisPrefixIndex

if TYPE_CHECKING:
    from conftest import FakeClock

A = list(range(500, 520))
B = [*A[:6], 900, 901, 902]


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis), "fakeredis"])
async def pair(
    request: pytest.FixtureRequest, clock: FakeClock
) -> AsyncIterator[tuple[RedisPrefixIndex, AsyncRedisPrefixIndex]]:
    """A sync and an async index on one key prefix (TTL 30 s, capacity 12, fake clock)."""
    prefix = f"pdd-test:async:{uuid.uuid4().hex}"
    options: dict[str, Any] = {
        "key_prefix": prefix,
        "default_capacity_blocks": 12,
        "ttl_s": 30.0,
        "clock": clock,
    }
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        sync = RedisPrefixIndex(url, **options)
        aindex = AsyncRedisPrefixIndex(url, **options)
        admin: Any = redis.Redis.from_url(url)
    else:
        server = fakeredis.FakeServer()
        url = "redis://fakeredis.invalid:6379/0"
        sync = RedisPrefixIndex(url, client=fakeredis.FakeRedis(server=server), **options)
        aindex = AsyncRedisPrefixIndex(
            url, client=fakeredis.FakeAsyncRedis(server=server), **options
        )
        admin = fakeredis.FakeRedis(server=server)
    try:
        yield sync, aindex
    finally:
        keys = list(admin.scan_iter(match=f"{prefix}:*"))
        if keys:
            admin.delete(*keys)
        admin.close()
        sync.close()
        await aindex.aclose()


async def test_async_and_sync_see_each_other(
    pair: tuple[RedisPrefixIndex, AsyncRedisPrefixIndex], clock: FakeClock
) -> None:
    sync, aindex = pair
    assert await aindex.ping() > 0
    sync.register(IndexedInstance("p1", Tier.P, "dc-a"))
    await aindex.register(IndexedInstance("md1", Tier.MD, "dc-b", capacity_blocks=5))
    assert await aindex.instances() == sync.instances()
    assert [i.instance_id for i in sync.instances()] == ["md1", "p1"]

    sync.store("p1", A[:10])
    await aindex.store("md1", B)  # capacity 5: keeps B[:5]
    expected = {"p1": 6, "md1": 5}
    assert sync.match(B) == expected
    assert await aindex.match(B) == expected
    assert await aindex.match(A, tier=Tier.P) == sync.match(A, tier=Tier.P) == {"p1": 10}
    assert await aindex.match(A, datacenter="dc-b") == {"md1": 5}
    assert await aindex.num_blocks("md1") == sync.num_blocks("md1") == 5

    await aindex.remove("p1", list(reversed(A[7:10])))
    assert sync.match(A) == await aindex.match(A) == {"p1": 7, "md1": 5}

    clock.advance(20)
    sync.store("p1", A[:3])  # refreshed at t + 20
    clock.advance(15)  # t + 35: only the refreshed blocks survive the 30 s TTL
    assert await aindex.match(A) == sync.match(A) == {"p1": 3, "md1": 0}

    await aindex.clear("p1")
    assert sync.num_blocks("p1") == 0
    await aindex.unregister("md1")
    assert sync.match(A) == await aindex.match(A) == {"p1": 0}
    assert [i.instance_id for i in await aindex.instances()] == ["p1"]


async def test_async_unknown_instance_raises(
    pair: tuple[RedisPrefixIndex, AsyncRedisPrefixIndex],
) -> None:
    _, aindex = pair
    with pytest.raises(UnknownInstanceError, match="nobody"):
        await aindex.store("nobody", A)
    with pytest.raises(UnknownInstanceError, match="nobody"):
        await aindex.clear("nobody")
    await aindex.unregister("nobody")  # a no-op, as in the sync index


async def test_async_unreachable_redis_is_a_user_error() -> None:
    url = "redis://127.0.0.1:1/0"
    aindex = AsyncRedisPrefixIndex(url, key_prefix="pdd-test:unreachable", retries=0)
    try:
        with pytest.raises(UserError, match=r"cannot reach Redis at redis://127\.0\.0\.1:1/0"):
            await aindex.ping()
        with pytest.raises(UserError):
            await aindex.match(A)
    finally:
        await aindex.aclose()


async def test_async_store_many_matches_the_sync_index(
    pair: tuple[RedisPrefixIndex, AsyncRedisPrefixIndex],
) -> None:
    sync, aindex = pair
    sync.register(IndexedInstance("p1", Tier.P, "dc-a", capacity_blocks=10_000))
    await aindex.register(IndexedInstance("md1", Tier.MD, "dc-b", capacity_blocks=5))
    await aindex.store_many([("p1", A[:10]), ("md1", B), ("p1", B[:8])])
    assert sync.match(B) == await aindex.match(B) == {"p1": 8, "md1": 5}
    assert await aindex.match(A) == {"p1": 10, "md1": 5}
    long = [("p1", list(range(10_000 * k, 10_000 * k + 3000))) for k in range(1, 4)]
    await aindex.store_many(long)  # three script calls, one round trip
    assert sync.match(long[2][1]) == {"p1": 3000, "md1": 0}
    with pytest.raises(UnknownInstanceError, match="nobody"):
        await aindex.store_many([("nobody", A), ("md1", [7, 8])])
    assert sync.match([7, 8]) == {"p1": 0, "md1": 2}
    await aindex.store_many([])

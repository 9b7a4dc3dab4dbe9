"""The shared prefix index in Redis, asyncio client: the same keys and scripts as the
blocking one (``router.index.redis_index``), for the service's event loop.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aredis

from policies.tiers import Tier
from router.index.base import Clock, IndexedInstance
from router.index.redis_connect import aclose_client, connect_async, reachable
from router.index.redis_layout import SCRIPTS, UNKNOWN, Layout

__all__ = ["AsyncRedisPrefixIndex"]


class AsyncRedisPrefixIndex:
    """The same index and key layout with redis.asyncio: every method is a coroutine.

    ``url`` names one server or, as ``redis+sentinel://``, a primary found through
    Sentinel (``router.index.redis_connect``). Nothing is sent before the first call;
    ``await index.ping()`` checks the server.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        key_prefix: str = "pdd",
        default_capacity_blocks: int | None = None,
        ttl_s: float | None = None,
        clock: Clock = time.time,
        socket_timeout_s: float = 1.0,
        retries: int = 3,
        client: aredis.Redis | None = None,
    ) -> None:
        self._layout = Layout(key_prefix, default_capacity_blocks, ttl_s, clock)
        self.url = url
        if client is None:
            client = connect_async(url, socket_timeout_s, retries)
        self._client: aredis.Redis = client
        self._scripts = {name: client.register_script(src) for name, src in SCRIPTS.items()}

    @property
    def key_prefix(self) -> str:
        return self._layout.prefix

    async def _run(self, name: str, args: list[str]) -> Any:
        with reachable(self.url):
            return await self._scripts[name](keys=[], args=args)

    async def ping(self) -> float:
        """One PING round trip; returns its duration in seconds."""
        with reachable(self.url):
            start = time.perf_counter()
            await self._client.ping()
            return time.perf_counter() - start

    async def aclose(self) -> None:
        await aclose_client(self._client)

    async def register(self, instance: IndexedInstance) -> None:
        await self._run("register", self._layout.register_args(instance))

    async def unregister(self, instance_id: str) -> None:
        """Forget the instance and its blocks; an unknown id is a no-op (idempotent)."""
        top = await self._run("unregister", [self.key_prefix, instance_id])
        if top == UNKNOWN:
            return
        await self._clear(instance_id, str(top))

    async def instances(self) -> list[IndexedInstance]:
        with reachable(self.url):
            reply = await self._client.hgetall(f"{self.key_prefix}:instances")
        return Layout.instances_reply(reply)

    async def store(self, instance_id: str, chain: Sequence[int]) -> None:
        reply = await self._run("store", self._layout.store_args(instance_id, chain))
        Layout.check_known(reply, instance_id)

    async def remove(self, instance_id: str, blocks: Sequence[int]) -> None:
        reply = await self._run("remove", self._layout.remove_args(instance_id, blocks))
        Layout.check_known(reply, instance_id)

    async def clear(self, instance_id: str) -> None:
        await self._clear(instance_id, "")

    async def _clear(self, instance_id: str, upto: str) -> None:
        left = 1
        while left:
            reply = await self._run("clear_some", self._layout.clear_args(instance_id, upto))
            left, upto = Layout.clear_reply(reply, instance_id)

    async def match(
        self, chain: Sequence[int], *, tier: Tier | None = None, datacenter: str | None = None
    ) -> dict[str, int]:
        names = self._layout.names
        reply = await self._run("match", self._layout.match_args(chain, tier, datacenter, names))
        return self._layout.match_reply(reply, names)

    async def num_blocks(self, instance_id: str) -> int:
        reply = await self._run("num_blocks", self._layout.num_blocks_args(instance_id))
        Layout.check_known(reply, instance_id)
        return int(reply)

"""The shared prefix index in Redis, asyncio client: the same keys and scripts as the
blocking one (``router.index.redis_index``), for the service's event loop.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aredis
from redis.exceptions import NoScriptError

from policies.tiers import Tier
from router.index.base import Clock, IndexedInstance, unknown_instances
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

    async def _run(self, name: str, args: Sequence[str | bytes]) -> Any:
        """One script call: EVALSHA straight through the client, loading the script when
        the server does not have it."""
        script = self._scripts[name]
        with reachable(self.url):
            try:
                return await self._client.evalsha(script.sha, 0, *args)
            except NoScriptError:
                return await script(keys=[], args=args)

    async def _run_many(self, calls: Sequence[tuple[str, Sequence[str | bytes]]]) -> list[Any]:
        """Script calls in order in one pipelined round trip (not a transaction); their
        replies. Calls the server did not have the script for are sent again, in order,
        once it is loaded (a NOSCRIPT call did nothing); another error is raised."""
        if len(calls) == 1:
            return [await self._run(*calls[0])]
        with reachable(self.url):
            pipe = self._client.pipeline(transaction=False)
            for name, args in calls:
                pipe.evalsha(self._scripts[name].sha, 0, *args)
            replies = await pipe.execute(raise_on_error=False)
            missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
            if missing:
                for name in {calls[i][0] for i in missing}:
                    self._scripts[name].sha = await self._client.script_load(SCRIPTS[name])
                pipe = self._client.pipeline(transaction=False)
                for i in missing:
                    name, args = calls[i]
                    pipe.evalsha(self._scripts[name].sha, 0, *args)
                for i, reply in zip(missing, await pipe.execute(raise_on_error=False), strict=True):
                    replies[i] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return list(replies)

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
        await self.store_many(((instance_id, chain),))

    async def store_many(self, items: Sequence[tuple[str, Sequence[int]]]) -> None:
        """Store the chains in order, in one round trip (see the blocking index)."""
        calls = self._layout.store_many_calls(items)
        if calls:
            replies = await self._run_many([("store_many", args) for args in calls])
            unknown = Layout.unknown_of(replies)
            if unknown:
                raise unknown_instances(unknown)

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

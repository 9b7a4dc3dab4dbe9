"""The shared prefix index in Redis, blocking client (redis-py): one round trip per match.

Key layout, scripts and their reasons: ``router.index.redis_layout``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import NoScriptError

from policies.tiers import Tier
from router.errors import UserError
from router.index.base import Clock, IndexedInstance, unknown_instances
from router.index.redis_connect import (
    close_client,
    cluster_key_prefix,
    connect,
    is_cluster,
    reachable,
    redact_url,
)
from router.index.redis_layout import SCRIPTS, UNKNOWN, Layout

__all__ = ["RedisContents", "RedisPrefixIndex", "redact_url"]


class RedisPrefixIndex:
    """:class:`~router.index.base.PrefixIndex` shared through Redis (redis-py, blocking).

    ``url`` names one server, as ``redis+sentinel://`` a primary found through Sentinel,
    or as ``redis+cluster://`` a Redis Cluster (``router.index.redis_connect``); on a
    cluster the key prefix becomes a hash tag (``pdd`` -> ``{pdd}``) unless it has one.
    ``client`` (e.g. a ``fakeredis.FakeRedis``) replaces the connection made from
    ``url``; the URL then only names the server in error messages. The constructor PINGs
    the server, so an unreachable URL fails at once with a UserError.
    """

    def __init__(  # noqa: PLR0913 -- connection and index settings, keyword-only with defaults
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        key_prefix: str = "pdd",
        default_capacity_blocks: int | None = None,
        ttl_s: float | None = None,
        clock: Clock = time.time,
        socket_timeout_s: float = 1.0,
        retries: int = 3,
        client: redis.Redis | None = None,
        connect_timeout_s: float | None = None,
    ) -> None:
        self.url = url
        if client is None:
            client = connect(url, socket_timeout_s, retries, connect_timeout_s)
        if is_cluster(client):  # every key in one slot: a match is one call to one node
            key_prefix = cluster_key_prefix(key_prefix)
        self._layout = Layout(key_prefix, default_capacity_blocks, ttl_s, clock)
        # the scripts name their keys in ARGV; this key routes a call (on a cluster, to
        # the node of the prefix's slot, which holds every key of the index)
        self._route = f"{self._layout.prefix}:instances"
        self._client: redis.Redis = client
        self.client = client
        self.key_prefix = self._layout.prefix
        # what outage recovery asks of the shared index: its generation, a rebuild's writes
        self.contents = RedisContents(self)
        self._scripts = {name: client.register_script(src) for name, src in SCRIPTS.items()}
        self._noop = client.register_script("return 0")
        try:
            self.ping()
        except UserError:
            close_client(client)
            raise

    def _run(self, name: str, args: Sequence[str | bytes]) -> Any:
        """One script call: EVALSHA straight through the client (the script object's own
        call costs more), loading the script when the server does not have it."""
        script = self._scripts[name]
        with reachable(self.url):
            try:
                return self._client.evalsha(script.sha, 1, self._route, *args)
            except NoScriptError:
                return script(keys=[self._route], args=args)

    def _run_many(self, calls: Sequence[tuple[str, Sequence[str | bytes]]]) -> list[Any]:
        """Script calls in order in one pipelined round trip (not a transaction); their
        replies. Calls the server did not have the script for are sent again, in order,
        once it is loaded (a NOSCRIPT call did nothing); another error is raised."""
        if len(calls) == 1:
            return [self._run(*calls[0])]
        with reachable(self.url):
            pipe = self._client.pipeline(transaction=False)
            for name, args in calls:
                pipe.evalsha(self._scripts[name].sha, 1, self._route, *args)
            replies = pipe.execute(raise_on_error=False)
            missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
            if missing:
                for name in {calls[i][0] for i in missing}:
                    self._scripts[name].sha = self._client.script_load(SCRIPTS[name])
                pipe = self._client.pipeline(transaction=False)
                for i in missing:
                    name, args = calls[i]
                    pipe.evalsha(self._scripts[name].sha, 1, self._route, *args)
                for i, reply in zip(missing, pipe.execute(raise_on_error=False), strict=True):
                    replies[i] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def ping(self) -> float:
        """One PING round trip; returns its duration in seconds."""
        with reachable(self.url):
            start = time.perf_counter()
            self._client.ping()
            return time.perf_counter() - start

    def match_floor(self, chain: Sequence[int]) -> float:
        """The round trip of a match that looks nothing up: a script that returns at once,
        called as ``match`` calls its own, with the same arguments. What every match costs
        before its first lookup (``bench index`` prints it); returns seconds."""
        args = self._layout.match_args(chain, None, None, self._layout.names)
        with reachable(self.url):
            try:
                start = time.perf_counter()
                self._client.evalsha(self._noop.sha, 1, self._route, *args)
            except NoScriptError:
                self._noop(keys=[self._route], args=args)
            return time.perf_counter() - start

    def close(self) -> None:
        close_client(self._client)

    def register(self, instance: IndexedInstance) -> None:
        self._run("register", self._layout.register_args(instance))

    def unregister(self, instance_id: str) -> None:
        """Forget the instance and its blocks; an unknown id is a no-op (idempotent)."""
        top = self._run("unregister", [self.key_prefix, instance_id])
        if top == UNKNOWN:
            return
        self._clear(instance_id, str(top))

    def instances(self) -> list[IndexedInstance]:
        with reachable(self.url):
            reply = self._client.hgetall(f"{self.key_prefix}:instances")
        return Layout.instances_reply(reply)

    def store(self, instance_id: str, chain: Sequence[int]) -> None:
        self.store_many(((instance_id, chain),))

    def store_many(self, items: Sequence[tuple[str, Sequence[int]]]) -> None:
        """Store the chains in order: one script call per ``STORE_CALL_BLOCKS`` blocks, all
        in one round trip. Unregistered instances are skipped, then named by an
        UnknownInstanceError."""
        calls = self._layout.store_many_calls(items)
        if calls:
            unknown = Layout.unknown_of(self._run_many([("store_many", args) for args in calls]))
            if unknown:
                raise unknown_instances(unknown)

    def remove(self, instance_id: str, blocks: Sequence[int]) -> None:
        reply = self._run("remove", self._layout.remove_args(instance_id, blocks))
        Layout.check_known(reply, instance_id)

    def clear(self, instance_id: str) -> None:
        self._clear(instance_id, "")

    def _clear(self, instance_id: str, upto: str) -> None:
        left = 1
        while left:
            reply = self._run("clear_some", self._layout.clear_args(instance_id, upto))
            left, upto = Layout.clear_reply(reply, instance_id)

    def match(
        self, chain: Sequence[int], *, tier: Tier | None = None, datacenter: str | None = None
    ) -> dict[str, int]:
        names = self._layout.names
        reply = self._run("match", self._layout.match_args(chain, tier, datacenter, names))
        return self._layout.match_reply(reply, names)

    def num_blocks(self, instance_id: str) -> int:
        reply = self._run("num_blocks", self._layout.num_blocks_args(instance_id))
        Layout.check_known(reply, instance_id)
        return int(reply)

    def delete_all_keys(self) -> int:
        """Delete every key under the prefix (SCAN + UNLINK; for tests and benchmarks)."""
        deleted = 0
        with reachable(self.url):
            batch: list[bytes] = []
            for key in self._client.scan_iter(
                match=f"{_glob_escape(self.key_prefix)}:*", count=1000
            ):
                batch.append(key)
                if len(batch) >= 1000:
                    deleted += int(self._client.unlink(*batch))
                    batch = []
            if batch:
                deleted += int(self._client.unlink(*batch))
        return deleted


class RedisContents:
    """The index's contents as a whole, for outage recovery: the token that names them
    (it changes when Redis lost them) and a rebuild's writes in one round trip."""

    def __init__(self, index: RedisPrefixIndex) -> None:
        self._index = index

    def generation(self) -> str:
        """The token naming the index's contents (set now when absent): it changes when Redis
        loses its data, e.g. a restart without persistence, so a client that remembers
        another one knows what it registered and stored is gone."""
        token = self._index._run("generation", [self._index.key_prefix, secrets.token_hex(8)])
        return token.decode() if isinstance(token, bytes) else str(token)

    def restore(
        self,
        instances: Sequence[IndexedInstance],
        chains: Sequence[tuple[str, Sequence[int]]],
    ) -> None:
        """Register ``instances`` then store ``chains`` (instance, chain), in this order, in
        one pipelined round trip; UnknownInstanceError when a chain's instance is not
        registered (the others are stored all the same)."""
        calls: list[tuple[str, Sequence[str | bytes]]] = [
            ("register", self._index._layout.register_args(instance)) for instance in instances
        ]
        calls += [("store_many", args) for args in self._index._layout.store_many_calls(chains)]
        if not calls:
            return
        replies = self._index._run_many(calls)
        unknown = Layout.unknown_of(replies[len(instances) :])
        if unknown:
            raise unknown_instances(unknown)


def _glob_escape(text: str) -> str:
    """Escape SCAN MATCH glob characters in a literal prefix."""
    out = []
    for ch in text:
        if ch in "*?[]\\":
            out.append("\\")
        out.append(ch)
    return "".join(out)

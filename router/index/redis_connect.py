"""Connecting to the shared index's Redis: one server by URL, a primary found through
Sentinel, or a Redis Cluster.

``redis.url`` names either one server, as redis-py reads it (``redis://``, ``rediss://``,
``unix://``), a primary that Redis Sentinel watches::

    redis+sentinel://[[username]:password@]host[:port][,host[:port]...]/service_name[/db]

or some nodes of a Redis Cluster (the others are discovered)::

    redis+cluster://[[username]:password@]host[:port][,host[:port]...]

The sentinels' port defaults to 26379, a cluster node's to 6379, the database to 0. The
username and password are the primary's (and its replicas'), or the cluster's; the
sentinels are asked without them. A client made from a Sentinel URL asks the sentinels
for the primary's address each time it connects, so after a failover its next call
reaches the promoted replica. A cluster client sends each command to the node serving
its key's slot; the index keeps all its keys in one slot (``cluster_key_prefix``), so a
match is still one call to one node. Both the blocking and the asyncio index get their
client here (the asyncio one: one server or Sentinel).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import MasterNotFoundError as AsyncMasterNotFoundError
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool

from router.errors import UserError

__all__ = [
    "CLUSTER_SCHEME",
    "SENTINEL_PORT",
    "SENTINEL_SCHEME",
    "ClusterTarget",
    "SentinelTarget",
    "aclose_client",
    "close_client",
    "cluster_key_prefix",
    "connect",
    "connect_async",
    "connect_kwargs",
    "is_cluster",
    "parse_redis_url",
    "reachable",
    "redact_url",
    "target_of",
    "valid_url",
]

SENTINEL_SCHEME = "redis+sentinel"
SENTINEL_PORT = 26379
CLUSTER_SCHEME = "redis+cluster"
CLUSTER_PORT = 6379
_SCHEMES = ("redis", "rediss", "unix", SENTINEL_SCHEME, CLUSTER_SCHEME)
_USERINFO = re.compile(r"(//[^/@:]*):[^/@]*@")


def redact_url(url: str) -> str:
    """The URL without its password (in the user part or a ``password`` query parameter),
    fit for an error message; one or several hosts."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return _USERINFO.sub(r"\1:***@", url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        parts = parts._replace(netloc=f"{userinfo.partition(':')[0]}:***@{hosts}")
    if parts.query:
        query = parse_qsl(parts.query, keep_blank_values=True)
        if any(key == "password" for key, _ in query):
            hidden = [(k, "***" if k == "password" else v) for k, v in query]
            parts = parts._replace(query=urlencode(hidden, safe="*"))
    return urlunsplit(parts)


def _reason(exc: BaseException) -> str:
    """The root cause of a connection error in a few words ("Connection refused")."""
    if isinstance(exc, MasterNotFoundError | AsyncMasterNotFoundError):
        return "no sentinel reported a reachable primary of the service"
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror
        seen = seen.__cause__ or seen.__context__
    text = " ".join(str(exc).split())
    return text.rstrip(".") or type(exc).__name__


@contextmanager
def reachable(url: str) -> Iterator[None]:
    """Turn "Redis is not there" into a one-line UserError naming the URL (or the Sentinel
    service and its sentinels)."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise UserError(f"cannot reach {target_of(url)}: {_reason(exc)}") from exc


@contextmanager
def valid_url(url: str) -> Iterator[None]:
    """Turn a malformed Redis URL into a one-line UserError naming it."""
    try:
        yield
    except ValueError as exc:
        raise UserError(f"invalid Redis URL {redact_url(url)}: {exc}") from exc


def _retry_backoff() -> ExponentialBackoff:
    return ExponentialBackoff(cap=0.5, base=0.01)


def connect_kwargs(
    socket_timeout_s: float,
    retries: int,
    retry_class: Any,
    connect_timeout_s: float | None = None,
) -> dict[str, Any]:
    """Client options both clients use: timeouts and redis-py's retry with backoff.

    Only connection errors are retried (a reconnect after a restart, a dropped
    connection or a failover); a timeout is not, so a hung server stalls a call for
    one ``socket_timeout_s``, not for ``retries + 1`` of them.
    """
    return {
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": socket_timeout_s
        if connect_timeout_s is None
        else connect_timeout_s,
        "retry": retry_class(_retry_backoff(), retries, supported_errors=(redis.ConnectionError,)),
    }


@dataclass(frozen=True)
class SentinelTarget:
    """A primary found through Sentinel: where to ask, which service, and its database."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None

    def describe(self) -> str:
        """The primary as an error message names it (never with the password)."""
        return f"the Redis primary {self.service!r} through the sentinels {_hosts(self.sentinels)}"


@dataclass(frozen=True)
class ClusterTarget:
    """Some nodes of a Redis Cluster (the client discovers the others)."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None

    def describe(self) -> str:
        """The cluster as an error message names it (never with the password)."""
        return f"the Redis Cluster at {_hosts(self.nodes)}"


def _hosts(addresses: tuple[tuple[str, int], ...]) -> str:
    return ",".join(
        f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host, port in addresses
    )


def cluster_key_prefix(prefix: str) -> str:
    """The key prefix an index uses on a Redis Cluster: a hash tag, so that every key of
    one index is in one slot (one node answers a whole match). A prefix that already has
    one (``{pdd}:llama``) is kept; several indexes (one per model, say) then spread over
    the cluster by their hash tags."""
    start = prefix.find("{")
    if start >= 0 and prefix.find("}", start + 2) > start:
        return prefix
    return f"{{{prefix}}}"


def parse_redis_url(url: str) -> SentinelTarget | ClusterTarget | None:  # noqa: C901 -- one named refusal per malformed part
    """The Sentinel target of a ``redis+sentinel://`` URL, the cluster of a
    ``redis+cluster://`` one, None for a URL of one server.

    ValueError (without the password) when the scheme is none of ``redis://``,
    ``rediss://``, ``unix://``, ``redis+sentinel://``, ``redis+cluster://`` or a Sentinel
    or cluster URL is malformed; a one-server URL is otherwise left for redis-py to read.
    """
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    if parts.scheme not in _SCHEMES:
        scheme = f"scheme {parts.scheme}://" if parts.scheme else "no scheme"
        raise ValueError(
            f"{scheme}: use redis://, rediss://, unix://, redis+sentinel:// or redis+cluster://"
        )
    if parts.scheme not in (SENTINEL_SCHEME, CLUSTER_SCHEME):
        return None
    what = "Sentinel" if parts.scheme == SENTINEL_SCHEME else "cluster"
    if parts.query or parts.fragment:
        raise ValueError(f"a {what} URL takes no query string or fragment")
    userinfo, at, hosts = parts.netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    if parts.scheme == CLUSTER_SCHEME:
        if not hosts:
            raise ValueError("list some cluster nodes: redis+cluster://host:port[,host:port...]")
        if parts.path.strip("/"):
            raise ValueError("a cluster URL takes no path (a Redis Cluster has only database 0)")
        nodes = tuple(_address(item, "cluster node", CLUSTER_PORT) for item in hosts.split(","))
        return ClusterTarget(nodes, username, password)
    if not hosts:
        raise ValueError("list the sentinels: redis+sentinel://host:port[,host:port...]/service")
    sentinels = tuple(_address(item, "sentinel", SENTINEL_PORT) for item in hosts.split(","))
    path = parts.path.strip("/").split("/") if parts.path.strip("/") else []
    if not path:
        raise ValueError("name the service after the sentinels: .../service_name[/db]")
    if len(path) > 2:
        raise ValueError("the path must be /service_name or /service_name/db")
    db = 0
    if len(path) == 2:
        if not path[1].isdigit():
            raise ValueError(f"the database must be a number, got {path[1]!r}")
        db = int(path[1])
    return SentinelTarget(sentinels, unquote(path[0]), db, username, password)


def _address(item: str, what: str, default_port: int) -> tuple[str, int]:
    """``host``, ``host:port`` or ``[ipv6]:port`` as (host, port)."""
    text = item.strip()
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"bad {what} address {item!r}")
        port_text = rest[1:]
    elif text.count(":") > 1:
        raise ValueError(f"write an IPv6 {what} address in brackets: [{text}]:{default_port}")
    else:
        host, _, port_text = text.partition(":")
    if not host:
        raise ValueError(f"a {what} address needs a host, got {item!r}")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"bad port in {what} address {item!r}")
    return host, int(port_text)


def target_of(url: str) -> str:
    """What an error message calls the Redis of ``url``: the redacted URL, or the
    Sentinel service and its sentinels."""
    try:
        target = parse_redis_url(url)
    except ValueError:
        target = None
    return f"Redis at {redact_url(url)}" if target is None else target.describe()


def _primary_kwargs(target: SentinelTarget) -> dict[str, Any]:
    return {"db": target.db, "username": target.username, "password": target.password}


def connect(
    url: str, socket_timeout_s: float, retries: int, connect_timeout_s: float | None = None
) -> redis.Redis:
    """A blocking client of ``url`` (UserError naming it when malformed)."""
    options = connect_kwargs(socket_timeout_s, retries, Retry, connect_timeout_s)
    with valid_url(url):
        target = parse_redis_url(url)
        if target is None:
            return redis.Redis.from_url(url, **options)
    if isinstance(target, ClusterTarget):
        return _connect_cluster(target, options)
    # one try per sentinel and discovery: asking the next sentinel is the retry
    # (Sentinel is untyped before redis-py 8.2, typed from it: either ignore may be unused)
    asking = connect_kwargs(socket_timeout_s, 0, Retry, connect_timeout_s)
    sentinel = Sentinel(target.sentinels, sentinel_kwargs=asking)  # type: ignore[no-untyped-call, unused-ignore]
    client = sentinel.master_for(  # type: ignore[no-untyped-call, unused-ignore]
        target.service, redis_class=redis.Redis, **options, **_primary_kwargs(target)
    )
    return cast(redis.Redis, client)


def connect_async(
    url: str, socket_timeout_s: float, retries: int, connect_timeout_s: float | None = None
) -> aredis.Redis:
    """An asyncio client of ``url`` (UserError naming it when malformed); nothing is
    sent before its first command."""
    options = connect_kwargs(socket_timeout_s, retries, AsyncRetry, connect_timeout_s)
    with valid_url(url):
        target = parse_redis_url(url)
        if target is None:
            return aredis.Redis.from_url(url, **options)
        if isinstance(target, ClusterTarget):
            raise ValueError("the asyncio index does not take a Redis Cluster")
    asking = connect_kwargs(socket_timeout_s, 0, AsyncRetry, connect_timeout_s)
    sentinel = AsyncSentinel(target.sentinels, sentinel_kwargs=asking)  # type: ignore[no-untyped-call, unused-ignore]
    client = sentinel.master_for(
        target.service, redis_class=aredis.Redis, **options, **_primary_kwargs(target)
    )
    return cast(aredis.Redis, client)


def _connect_cluster(target: ClusterTarget, options: dict[str, Any]) -> redis.Redis:
    """A cluster client; it reads the slot map from the first node that answers (a
    UserError naming the cluster when none does)."""
    nodes = [ClusterNode(host, port) for host, port in target.nodes]  # type: ignore[no-untyped-call, unused-ignore]
    try:
        client = RedisCluster(
            startup_nodes=nodes, username=target.username, password=target.password,
            socket_timeout=options["socket_timeout"],
            socket_connect_timeout=options["socket_connect_timeout"],
            retry=options["retry"],
        )  # fmt: skip
    except (redis.RedisError, OSError) as exc:
        raise UserError(f"cannot reach {target.describe()}: {_reason(exc)}") from exc
    # the index uses the commands both clients have; its keys share one slot
    return cast(redis.Redis, client)


def is_cluster(client: object) -> bool:
    """Whether the client talks to a Redis Cluster."""
    return isinstance(client, RedisCluster)


def close_client(client: redis.Redis) -> None:
    """Close the client, and the connections to its sentinels when it has some."""
    pool = getattr(client, "connection_pool", None)
    client.close()
    if isinstance(pool, SentinelConnectionPool):
        pool.sentinel_manager.close()


async def aclose_client(client: aredis.Redis) -> None:
    """Close the asyncio client, and the connections to its sentinels when it has some."""
    pool = getattr(client, "connection_pool", None)
    await client.aclose()
    if isinstance(pool, AsyncSentinelPool):
        await pool.sentinel_manager.aclose()

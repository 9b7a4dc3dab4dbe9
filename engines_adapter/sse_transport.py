"""Engines' event streams over connections of their own: an httpx transport for requests
that ask for ``text/event-stream`` on plain HTTP/1.1, everything else passed on.

A streamed token is one small chunk of the response: httpcore and h11 spend several
generator layers and parser objects on each, the bulk of the router's CPU per relayed
token. Here the connection is an asyncio protocol whose C parser (httptools, uvicorn's)
strips the chunk framing as bytes arrive (``sse_connection.py``); the body's reader takes
every byte that came since its last read at once, so a reader that fell behind catches up
in one step.

Timeouts are httpx's (``connect``, ``read`` between two body reads and for the head) and
so are the errors (``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``, ``ReadError``,
``RemoteProtocolError``). A stream closed before its end closes its connection (the
engine sees it drop and aborts the request); one read to its end goes back to the pool.
A request is sent at most once: a kept-alive connection is reused only while it stays
open (idle less than ``IDLE_S``, no close from the engine arrived), and one the engine
closes before answering fails the request (``RemoteProtocolError``), as httpx's own
transport does, since the engine may have read it. Streams waiting for a
connection wait in line: each connection that goes idle or closes wakes the oldest, which
takes one idle to its engine, a free slot, or closes one idle to another engine for room.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable

import httpx

from engines_adapter.sse_connection import Connection, request_bytes

__all__ = ["SseTransport"]

IDLE_PER_HOST = 64
"""Kept-alive connections held per engine once their streams ended."""
IDLE_S = 4.0
"""Seconds a kept-alive connection may stay idle and still be reused: engines served by
uvicorn close theirs after 5 s, and a request sent as they do would be lost."""


class _Body(httpx.AsyncByteStream):
    """A response's body; closing it hands the connection back or closes it."""

    def __init__(
        self, conn: Connection, timeout_s: float | None, done: Callable[[Connection], None]
    ) -> None:
        self._conn, self._timeout_s, self._done = conn, timeout_s, done
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for data in self._conn.body(self._timeout_s):
            yield data

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._done(self._conn)


def _own(request: httpx.Request) -> bool:
    """An event stream asked for over plain HTTP with a body of known length: what this
    transport frames itself (anything else, e.g. a chunked upload, an ``Expect`` or a HEAD,
    goes to httpx's own transport, which knows every case of the protocol)."""
    headers = request.headers
    return (
        request.url.scheme == "http"
        and headers.get("accept") == "text/event-stream"
        and request.method in ("GET", "POST")
        and "transfer-encoding" not in headers
        and "expect" not in headers
    )


class SseTransport(httpx.AsyncBaseTransport):
    """Event streams (``Accept: text/event-stream``, ``http://``) on at most
    ``max_connections`` connections of its own (waiting for one at most httpx's ``pool``
    timeout), kept alive ``idle_s`` at most between streams; every other request
    through ``fallback``."""

    def __init__(
        self, fallback: httpx.AsyncBaseTransport, max_connections: int, idle_s: float = IDLE_S
    ) -> None:
        self._fallback = fallback
        self._idle: dict[tuple[str, int], list[Connection]] = {}
        self._max = max_connections
        self._idle_s = idle_s
        self._open = 0  # connections open or opening, idle ones included
        # streams waiting for a connection, oldest first (a waiter woken with nothing
        # for it waits again in its place, under a new future)
        self._waiters: dict[object, asyncio.Future[None]] = {}
        self._woken = 0  # waiters woken that have not run yet
        self._shut = False  # closed: no connection is kept any more

    @property
    def waiting(self) -> int:
        """Streams waiting for a connection (those woken and about to take one included)."""
        return len(self._waiters)

    @property
    def idle_connections(self) -> int:
        """Connections kept alive between streams, to any engine."""
        return sum(len(idle) for idle in self._idle.values())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if not _own(request):
            return await self._fallback.handle_async_request(request)
        timeouts = request.extensions.get("timeout", {})
        data = request_bytes(request, await request.aread())
        key = (url.host, url.port or 80)
        conn = await self._acquire(request, key, timeouts.get("pool"))
        if conn is None:  # no idle connection: a slot for a new one
            lost = functools.partial(self._lost, key)
            conn = await _connect(request, key, timeouts.get("connect"), lost)
        # sent once: an engine that closes the connection before answering may have read
        # the request (and started generating), so it is never sent again here
        status, headers = await _ask(conn, request, data, timeouts.get("read"))
        return httpx.Response(
            status, headers=headers, extensions={"http_version": conn.http_version},
            stream=_Body(conn, timeouts.get("read"), lambda done: self._release(key, done)),
        )  # fmt: skip

    async def _acquire(
        self, request: httpx.Request, key: tuple[str, int], timeout_s: float | None
    ) -> Connection | None:
        """An idle connection to ``key``, else None once a new one is counted: closing an
        idle connection to another engine for it when all are open, or waiting, behind
        the streams that came first, for one to close or go idle."""
        try:
            async with asyncio.timeout(timeout_s):
                if not self._waiters:
                    got = self._take(key)
                    if got is not False:
                        return None if got is True else got
                return await self._wait_turn(key)
        except TimeoutError:
            what = f"all {self._max} stream connections to engines stayed busy"
            raise httpx.PoolTimeout(what, request=request) from None

    async def _wait_turn(self, key: tuple[str, int]) -> Connection | None:
        """Wait in line until woken, then take what a release or close left; a waiter
        woken then cancelled passes the wake on to the next."""
        token = object()
        loop = asyncio.get_running_loop()
        try:
            while True:
                woken = self._waiters[token] = loop.create_future()
                if self._room() > self._woken:  # room no waiter was woken for
                    self._wake_one()
                try:
                    await woken
                except asyncio.CancelledError:
                    if woken.done() and not woken.cancelled():
                        self._woken -= 1
                        self._wake_one()
                    raise
                self._woken -= 1
                got = self._take(key)
                if got is not False:
                    return None if got is True else got
        finally:
            del self._waiters[token]

    def _take(self, key: tuple[str, int]) -> Connection | bool:
        """An idle connection to ``key``, else True once a new one is counted (closing an
        idle one to another engine when all are open), else False."""
        conn = self._take_idle(key)
        if conn is not None:
            return conn
        if self._open >= self._max:
            spare = next((idle[0] for idle in self._idle.values() if idle), None)
            if spare is None:
                return False
            spare.close()  # off its idle list and counted out at once
        self._open += 1
        return True

    def _room(self) -> int:
        """Connections a stream could have now: slots free and connections idle."""
        return self._max - self._open + self.idle_connections

    def _wake_one(self) -> None:
        """Wake the oldest waiter not yet woken, if any."""
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_result(None)
                self._woken += 1
                return

    def _take_idle(self, key: tuple[str, int]) -> Connection | None:
        """The latest idle connection to ``key``, after closing those idle too long."""
        idle = self._idle.get(key)
        if not idle:
            return None
        oldest = asyncio.get_running_loop().time() - self._idle_s
        for stale in [conn for conn in idle if conn.idle_since < oldest]:
            stale.close()  # off the list as it closes
        while idle:
            conn = idle.pop()
            if conn.lost:
                continue
            if conn.closed_by_peer():  # its close is in, not yet seen by the loop
                conn.close()
                continue
            return conn
        return None

    def _release(self, key: tuple[str, int], conn: Connection) -> None:
        """An ended response's connection goes to its engine's idle list (waking the
        oldest waiter), or is closed (which wakes it)."""
        idle = self._idle.setdefault(key, [])
        if conn.reusable() and len(idle) < IDLE_PER_HOST and not self._shut:
            conn.park(asyncio.get_running_loop().time())
            idle.append(conn)
            self._wake_one()
        else:
            conn.close()

    def _lost(self, key: tuple[str, int], conn: Connection | None) -> None:
        """A connection to ``key`` closed (or failed to open: None). One that was idle
        leaves its list: a slot instead of an idle connection, nothing new for a waiter;
        any other frees a slot, and the oldest waiter is woken for it."""
        self._open -= 1
        idle = self._idle.get(key)
        if conn is not None and idle and conn in idle:
            idle.remove(conn)
        else:
            self._wake_one()

    async def aclose(self) -> None:
        self._shut = True  # a stream still being read closes its connection when it ends
        for idle in self._idle.values():
            for conn in list(idle):
                conn.close()  # off the list as it closes
        await self._fallback.aclose()


async def _ask(
    conn: Connection, request: httpx.Request, data: bytes, timeout_s: float | None
) -> tuple[int, list[tuple[bytes, bytes]]]:
    """Send the request on ``conn`` and wait for the response's head; the connection is
    closed when that fails or the caller is cancelled (the engine drops the request)."""
    conn.start(request, data)
    try:
        return await conn.head(timeout_s)
    except BaseException:
        conn.close()
        raise


async def _connect(
    request: httpx.Request,
    key: tuple[str, int],
    timeout_s: float | None,
    on_lost: Callable[[Connection | None], None],
) -> Connection:
    """A new connection to ``key``; ``on_lost`` runs once, with it when it has closed, or
    with None when it failed to open before it existed (a timeout or cancel that lands
    once the protocol exists may close it first)."""
    loop = asyncio.get_running_loop()
    made: list[Connection] = []

    def protocol() -> Connection:
        conn = Connection(request, lambda: on_lost(conn))
        made.append(conn)
        return conn

    try:
        async with asyncio.timeout(timeout_s):
            _, conn = await loop.create_connection(protocol, *key)
    except BaseException as exc:
        if made:
            made[0].close()
        else:
            on_lost(None)
        if isinstance(exc, TimeoutError):
            what = f"connecting to {key[0]}:{key[1]} timed out"
            raise httpx.ConnectTimeout(what, request=request) from None
        if isinstance(exc, OSError):
            raise httpx.ConnectError(str(exc), request=request) from exc
        raise
    return conn


def engine_transport(streams: int, others: int, keepalive: int | None = None) -> SseTransport:
    """The transport of the router's one client to engines: at most ``streams``
    connections for event streams (one per request being generated) and ``others`` for
    prefills, probes and load reads."""
    limits = httpx.Limits(max_connections=max(1, others), max_keepalive_connections=keepalive)
    return SseTransport(httpx.AsyncHTTPTransport(limits=limits), max(1, streams))

"""Engines' event streams over connections of their own: an httpx transport for requests
that ask for ``text/event-stream`` on plain HTTP/1.1, everything else passed on.

A streamed token is one small chunk of the response: httpcore and h11 spend several
generator layers and parser objects on each, the bulk of the router's CPU per relayed
token. Here the connection is an asyncio protocol whose C parser (httptools, uvicorn's)
strips the chunk framing as bytes arrive; the body's reader takes every byte that came
since its last read at once, so a reader that fell behind catches up in one step.

Timeouts are httpx's (``connect``, ``read`` between two body reads and for the head) and
so are the errors (``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``, ``ReadError``,
``RemoteProtocolError``). A stream closed before its end closes its connection (the
engine sees it drop and aborts the request); one read to its end goes back to the pool.
A kept-alive connection the engine closed meanwhile is replaced once, before any byte of
the answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import cast

import httptools
import httpx

__all__ = ["SseTransport"]

PAUSE_BYTES = 1 << 20
"""Unread body bytes at which the connection stops reading until the reader catches up."""
IDLE_PER_HOST = 64
"""Kept-alive connections held per engine once their streams ended."""


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: the head and body of one response at a time."""

    def __init__(self, request: httpx.Request, on_lost: Callable[[], None]) -> None:
        self.request = request  # the request being answered (errors name it)
        self._on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0  # when the read waiting now times out (loop time)
        self._error: Exception | None = None
        self._eof_ends = False  # no length, not chunked: the body ends with the connection
        self.head_done = False
        self.complete = False
        self.lost = False
        self.answered = False  # a byte of the response came
        self.keep_alive = False
        self.idle_since = 0.0

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.answered = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            what = f"malformed response: {exc}"
            self._fail(httpx.RemoteProtocolError(what, request=self.request))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._on_lost()
        if self.complete:
            return
        if self.head_done and self._eof_ends and exc is None:
            self.on_message_complete()
            return
        what = "peer closed connection without sending complete message body"
        self._fail(httpx.RemoteProtocolError(what, request=self.request) if exc is None
                   else httpx.ReadError(repr(exc), request=self.request))  # fmt: skip

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.head_done = True
        names = {name.lower() for name, _ in self._headers}
        self._eof_ends = not names & {b"content-length", b"transfer-encoding"}
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered >= PAUSE_BYTES and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()  # False once the parser resets
        self._wake()

    # the reader's side
    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: Exception) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    def start(self, request: httpx.Request, data: bytes) -> None:
        """Send a request on this (idle) connection."""
        self.request, self._headers, self._body, self._buffered = request, [], [], 0
        self.head_done = self.complete = self.answered = self.keep_alive = False
        assert self.transport is not None
        self.transport.write(data)

    async def _wait(self, timeout_s: float | None) -> None:
        """Until the parser has news (a read), or ReadTimeout ``timeout_s`` after the
        start; one timer per connection, set again only when it goes off early (a
        relayed token's read schedules no timer of its own)."""
        if self._error is not None:
            raise self._error
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        if timeout_s is not None:
            self._due = loop.time() + timeout_s
            if self._timer is None:
                self._timer = loop.call_at(self._due, self._check)
        try:
            await waiter
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error

    def _check(self) -> None:
        """The read timer: a read waiting past its due time fails the connection; one
        waiting less long sets the timer for its due time; none waiting: the next sets it."""
        self._timer = None
        if self._waiter is None or self._waiter.done():
            return
        loop = asyncio.get_running_loop()
        if loop.time() < self._due:
            self._timer = loop.call_at(self._due, self._check)
            return
        self.close()
        self._fail(httpx.ReadTimeout("timed out reading the response", request=self.request))

    async def head(self, timeout_s: float | None) -> tuple[int, list[tuple[bytes, bytes]]]:
        """The status and headers of the response."""
        while not self.head_done:
            await self._wait(timeout_s)
        return self._parser.get_status_code(), self._headers

    async def body(self, timeout_s: float | None) -> AsyncIterator[bytes]:
        """The body as it comes: each read gives every byte received since the last."""
        while True:
            if self._body:
                data = self._body[0] if len(self._body) == 1 else b"".join(self._body)
                self._body, self._buffered = [], 0
                if self._paused and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                yield data
            elif self.complete:
                return
            else:
                await self._wait(timeout_s)

    def reusable(self) -> bool:
        """Whether another request may use this connection."""
        return self.complete and self.keep_alive and not self.lost

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None and not self.lost:
            self.transport.close()
        self.lost = True


class _Body(httpx.AsyncByteStream):
    """A response's body; closing it hands the connection back or closes it."""

    def __init__(self, conn: _Connection, timeout_s: float | None, done: _Release) -> None:
        self._conn, self._timeout_s, self._done = conn, timeout_s, done
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for data in self._conn.body(self._timeout_s):
            yield data

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._done(self._conn)


class _Release:
    """Where an ended response's connection goes: the host's idle list, or closed."""

    def __init__(self, idle: list[_Connection]) -> None:
        self._idle = idle

    def __call__(self, conn: _Connection) -> None:
        if conn.reusable() and len(self._idle) < IDLE_PER_HOST:
            conn.idle_since = asyncio.get_running_loop().time()
            self._idle.append(conn)
        else:
            conn.close()


class SseTransport(httpx.AsyncBaseTransport):
    """Event streams (``Accept: text/event-stream``, ``http://``) on at most
    ``max_connections`` connections of its own (waiting for one at most httpx's ``pool``
    timeout); every other request through ``fallback``."""

    def __init__(self, fallback: httpx.AsyncBaseTransport, max_connections: int) -> None:
        self._fallback = fallback
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._max = max_connections
        self._open = 0
        self._freed: asyncio.Event = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http" or request.headers.get("accept") != "text/event-stream":
            return await self._fallback.handle_async_request(request)
        timeouts = request.extensions.get("timeout", {})
        data = _request_bytes(request, await request.aread())
        key = (url.host, url.port or 80)
        idle = self._idle.setdefault(key, [])
        conn = _take_idle(idle)
        head = None
        if conn is not None:
            try:
                head = await _ask(conn, request, data, timeouts.get("read"))
            except (httpx.RemoteProtocolError, httpx.ReadError):
                if conn.answered:  # the engine answered, then broke: not a stale connection
                    raise
        if head is None:  # no idle connection, or one the engine closed meanwhile
            await self._room(request, timeouts.get("pool"))
            conn = await _connect(request, key, timeouts.get("connect"), self._closed)
            head = await _ask(conn, request, data, timeouts.get("read"))
        assert conn is not None
        status, headers = head
        release = _Release(idle)
        return httpx.Response(
            status, headers=headers, stream=_Body(conn, timeouts.get("read"), release),
            extensions={"http_version": b"HTTP/1.1"},
        )  # fmt: skip

    async def _room(self, request: httpx.Request, timeout_s: float | None) -> None:
        """Count a new connection, closing an idle one or waiting when all are open."""
        if self._open >= self._max:
            conn = next((c for idle in self._idle.values() for c in idle if not c.lost), None)
            if conn is not None:
                conn.close()
        try:
            async with asyncio.timeout(timeout_s):
                while self._open >= self._max:
                    self._freed.clear()
                    await self._freed.wait()
        except TimeoutError:
            what = f"all {self._max} stream connections to engines stayed busy"
            raise httpx.PoolTimeout(what, request=request) from None
        self._open += 1

    def _closed(self) -> None:
        self._open -= 1
        self._freed.set()

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
            idle.clear()
        await self._fallback.aclose()


async def _ask(
    conn: _Connection, request: httpx.Request, data: bytes, timeout_s: float | None
) -> tuple[int, list[tuple[bytes, bytes]]]:
    """Send the request on ``conn`` and wait for the response's head; the connection is
    closed when that fails or the caller is cancelled (the engine drops the request)."""
    conn.start(request, data)
    try:
        return await conn.head(timeout_s)
    except BaseException:
        conn.close()
        raise


def _take_idle(idle: list[_Connection]) -> _Connection | None:
    while idle:
        conn = idle.pop()
        if not conn.lost:
            return conn
    return None


async def _connect(
    request: httpx.Request,
    key: tuple[str, int],
    timeout_s: float | None,
    on_lost: Callable[[], None],
) -> _Connection:
    """A new connection to ``key``; ``on_lost`` runs once it has closed (or never opened)."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            _, conn = await loop.create_connection(lambda: _Connection(request, on_lost), *key)
    except TimeoutError:
        on_lost()
        what = f"connecting to {key[0]}:{key[1]} timed out"
        raise httpx.ConnectTimeout(what, request=request) from None
    except BaseException as exc:
        on_lost()
        if isinstance(exc, OSError):
            raise httpx.ConnectError(str(exc), request=request) from exc
        raise
    return conn


def _request_bytes(request: httpx.Request, body: bytes) -> bytes:
    """The request's head and body as sent on the wire."""
    target = request.url.raw_path
    lines = [request.method.encode("ascii"), b" ", target, b" HTTP/1.1\r\n"]
    for name, value in request.headers.raw:
        lines += [name, b": ", value, b"\r\n"]
    lines.append(b"\r\n")
    lines.append(body)
    return b"".join(lines)


def engine_transport(max_connections: int, keepalive: int | None = None) -> SseTransport:
    """The transport of the router's one client to engines, holding at most
    ``max_connections``: three quarters for event streams (one per request being
    generated), the rest for prefills, probes and load reads."""
    streams = max(1, max_connections * 3 // 4)
    others = max(1, max_connections - streams)
    limits = httpx.Limits(max_connections=others, max_keepalive_connections=keepalive)
    return SseTransport(httpx.AsyncHTTPTransport(limits=limits), streams)

"""One HTTP/1.1 connection to an engine for ``SseTransport``: an asyncio protocol whose C
parser (httptools, uvicorn's) strips the chunk framing as bytes arrive; the body's reader
takes every byte that came since its last read at once."""

from __future__ import annotations

import asyncio
import select
from collections.abc import AsyncIterator, Callable
from typing import cast

import httptools
import httpx

__all__ = ["PAUSE_BYTES", "Connection", "request_bytes"]

PAUSE_BYTES = 1 << 20
"""Unread body bytes at which the connection stops reading until the reader catches up."""


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: the head and body of one response at a time. ``on_lost``
    runs once, when the connection closes (whichever of its closes comes first)."""

    def __init__(self, request: httpx.Request, on_lost: Callable[[], None]) -> None:
        self.request = request  # the request being answered (errors name it)
        self._on_lost: Callable[[], None] | None = on_lost
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # when the timer goes off (loop time)
        self._due: float | None = None  # when the read waiting now times out (loop time)
        self._error: Exception | None = None
        self._eof_ends = False  # no length, not chunked: the body ends with the connection
        self.head_done = False
        self.complete = False
        self.lost = False
        self.keep_alive = False
        self.idle_since = 0.0

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            what = f"malformed response: {exc}"
            self._fail(httpx.RemoteProtocolError(what, request=self.request))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.lose()
        if self.complete:
            return
        if self.head_done and self._eof_ends and exc is None:
            self.on_message_complete()
            return
        what = "peer closed connection without sending complete message body"
        self._fail(httpx.RemoteProtocolError(what, request=self.request) if exc is None
                   else httpx.ReadError(repr(exc), request=self.request))  # fmt: skip

    def lose(self) -> None:
        """Run ``on_lost`` unless it ran already."""
        on_lost, self._on_lost = self._on_lost, None
        if on_lost is not None:
            on_lost()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        if 100 <= self._parser.get_status_code() < 200:  # an interim answer: the real one follows
            self._headers = []
            return
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
        if not self.head_done:  # the end of an interim (1xx) answer
            return
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
        """Send a request on this (idle) connection, with no read timer of the last's."""
        self.request, self._headers, self._body, self._buffered = request, [], [], 0
        self.head_done = self.complete = self.keep_alive = False
        self._stop_timer()
        assert self.transport is not None
        self.transport.write(data)

    def park(self, now: float) -> None:
        """The connection goes idle at loop time ``now``."""
        self._stop_timer()
        self.idle_since = now

    def _stop_timer(self) -> None:
        self._due = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _wait(self, timeout_s: float | None) -> None:
        """Until the parser has news (a read), or ReadTimeout ``timeout_s`` after the
        start; one timer per connection, set again only when it goes off early or a read
        is due before it (a relayed token's read schedules no timer of its own)."""
        if self._error is not None:
            raise self._error
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        self._due = None if timeout_s is None else loop.time() + timeout_s
        if self._due is not None and (self._timer is None or self._due < self._timer_at):
            self._set_timer(loop, self._due)
        try:
            await waiter
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error

    def _set_timer(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = loop.call_at(at, self._check), at

    def _check(self) -> None:
        """The read timer: a read waiting past its due time fails the connection; one
        waiting less long sets the timer for its due time; none waiting: the next sets it."""
        self._timer = None
        if self._waiter is None or self._waiter.done() or self._due is None:
            return
        loop = asyncio.get_running_loop()
        if loop.time() < self._due:
            self._set_timer(loop, self._due)
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

    @property
    def http_version(self) -> bytes:
        """The response's protocol, as httpx names it (``HTTP/1.1``, ``HTTP/1.0``)."""
        return b"HTTP/" + self._parser.get_http_version().encode("ascii")

    def closed_by_peer(self) -> bool:
        """Whether an idle connection's socket has something to read: the engine's close
        (or bytes it should not have sent) arrived and the loop has not handled it yet."""
        sock = None if self.transport is None else self.transport.get_extra_info("socket")
        if sock is None:
            return True
        poll = select.poll()  # not select.select: descriptors past 1024 are common here
        poll.register(sock.fileno(), select.POLLIN)
        return bool(poll.poll(0))

    def reusable(self) -> bool:
        """Whether another request may use this connection: its response came whole and
        it is still reading (one paused under an unread body would never hear the next)."""
        return self.complete and self.keep_alive and not self.lost and not self._paused

    def close(self) -> None:
        self._stop_timer()
        if self.transport is not None and not self.lost:
            self.transport.close()
        self.lost = True
        self.lose()


def request_bytes(request: httpx.Request, body: bytes) -> bytes:
    """The request's head and body as sent on the wire."""
    target = request.url.raw_path
    lines = [request.method.encode("ascii"), b" ", target, b" HTTP/1.1\r\n"]
    for name, value in request.headers.raw:
        if any(c in name or c in value for c in (b"\r", b"\n", b"\0")):
            raise httpx.LocalProtocolError(f"illegal header {name!r}: {value!r}", request=request)
        lines += [name, b": ", value, b"\r\n"]
    lines.append(b"\r\n")
    lines.append(body)
    return b"".join(lines)

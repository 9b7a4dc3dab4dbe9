"""uvicorn's HTTP protocol with the connection limits uvicorn lacks: a deadline on request
headers and on request bodies, and caps on open connections per address and in all.

uvicorn closes idle kept-alive connections (``timeout_keep_alive``, used as is) but reads
headers and bodies without a deadline, and accepts connections without a cap, so one
client trickling bytes holds sockets until the process runs out of file descriptors.
These limits have to act on the socket: an ASGI middleware runs only once the headers are
in, and sees a body only as the application reads it. So this subclasses uvicorn's own
httptools protocol (the one it picks when httptools is installed, a dependency) and uses
its parser's callbacks to arm and cancel one timer per connection; a deadline closes the
transport, which also ends the application's wait for the body (``http.disconnect``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from router.service.connection_limits import ConnectionGuard, Limit, LimitLog
from router.service.connection_settings import ConnectionSettings

__all__ = ["ConnectionLimits", "connection_limits", "limited_protocol"]


@dataclass
class ConnectionLimits:
    """What every connection of one server shares: its settings, the open connections
    (``guard``) and the log of closed ones."""

    settings: ConnectionSettings
    guard: ConnectionGuard
    log: LimitLog


def connection_limits(settings: ConnectionSettings) -> ConnectionLimits:
    """The limits of one server (``settings``, whose connection cap `serve` has fitted to
    the file-descriptor budget), logging to the service's log as warnings."""
    import structlog

    log = structlog.get_logger("pdd_router.service")

    def call_later(delay: float, callback: Callable[[], None]) -> object:
        return asyncio.get_running_loop().call_later(delay, callback)

    return ConnectionLimits(
        settings=settings,
        guard=ConnectionGuard(settings.max_connections, settings.max_connections_per_address),
        log=LimitLog(settings.log_every_s, log.warning, time.monotonic, call_later),
    )


def limited_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """The protocol class to give uvicorn (``http=``): every connection it serves is held
    to ``limits``."""

    class Limited(LimitedHttpToolsProtocol):
        shared = limits

    return Limited


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """One connection: admitted under the caps, and closed when its request's headers or
    body miss their deadline. ``shared`` is set by ``limited_protocol``."""

    shared: ConnectionLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._address: str | None = None  # set while the connection counts against the caps

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        address = self.client[0] if self.client else "unknown"
        refused = self.shared.guard.admit(address)
        if refused is not None:
            self.shared.log.record(refused, address)
            transport.close()
            return
        self._address = address
        self._arm("header_timeout_s")  # idle before its first request, or slow headers

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._address is not None:
            self.shared.guard.release(self._address)
            self._address = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # cancels uvicorn's keep-alive timer
        idle = self.cycle is None or self.cycle.response_complete
        if self._deadline is None and idle and not self.transport.is_closing():
            self._arm("header_timeout_s")  # bytes after a response, but no full request yet

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:
            self._arm("header_timeout_s")

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        self._arm("body_timeout_s")  # cancelled at once by on_message_complete without a body

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _arm(self, limit: Limit) -> None:
        self._disarm()
        delay: float = getattr(self.shared.settings, limit)
        self._deadline = self.loop.call_later(delay, self._expired, limit)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, limit: Limit) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.shared.log.record(limit, self._address or "unknown")
            self.transport.close()

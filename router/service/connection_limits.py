"""Client connections' bookkeeping: open connections counted per address against the
caps, and one rate-limited log line per limit when it closes connections."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

__all__ = ["LIMIT_REASONS", "ConnectionGuard", "Limit", "LimitLog"]

Limit = Literal[
    "max_connections", "max_connections_per_address", "header_timeout_s", "body_timeout_s"
]

LIMIT_REASONS: dict[Limit, str] = {
    "max_connections": "refused: the router holds its maximum of open connections",
    "max_connections_per_address": "refused: the address holds its maximum of connections",
    "header_timeout_s": "closed: request headers not complete in time",
    "body_timeout_s": "closed: request body not complete in time",
}


@dataclass
class ConnectionGuard:
    """Open connections per client address, admitted up to ``per_address`` each and
    ``total`` in all."""

    total: int
    per_address: int
    open: Counter[str] = field(default_factory=Counter)
    count: int = 0

    def admit(self, address: str) -> Limit | None:
        """Count a new connection from ``address``, or name the cap it would pass (then it
        is not counted)."""
        if self.count >= self.total:
            return "max_connections"
        if self.open[address] >= self.per_address:
            return "max_connections_per_address"
        self.open[address] += 1
        self.count += 1
        return None

    def release(self, address: str) -> None:
        """An admitted connection from ``address`` has closed."""
        self.open[address] -= 1
        if self.open[address] <= 0:
            del self.open[address]
        self.count -= 1


class _Emit(Protocol):
    def __call__(self, event: str, **fields: Any) -> Any: ...


@dataclass
class _Window:
    closed: int = 0
    addresses: Counter[str] = field(default_factory=Counter)
    last_line: float | None = None
    flush_pending: bool = False


@dataclass
class LimitLog:
    """One warning line per limit at most every ``every_s`` seconds: the first connection a
    limit closes is logged at once; those closed in the next ``every_s`` are counted and
    logged together when it ends (``call_later`` schedules that), naming the address that
    lost the most. An attack closes many connections and writes a few lines."""

    every_s: float
    emit: _Emit
    clock: Callable[[], float]
    call_later: Callable[[float, Callable[[], None]], object]
    windows: dict[Limit, _Window] = field(default_factory=dict)

    def record(self, limit: Limit, address: str) -> None:
        """A connection from ``address`` was closed by ``limit``."""
        window = self.windows.setdefault(limit, _Window())
        window.closed += 1
        window.addresses[address] += 1
        now = self.clock()
        if window.last_line is None or now - window.last_line >= self.every_s:
            self._line(limit, window, now)
        elif not window.flush_pending:
            window.flush_pending = True
            wait = window.last_line + self.every_s - now
            self.call_later(wait, lambda: self._flush(limit))

    def _flush(self, limit: Limit) -> None:
        window = self.windows[limit]
        window.flush_pending = False
        if window.closed:
            self._line(limit, window, self.clock())

    def _line(self, limit: Limit, window: _Window, now: float) -> None:
        address, from_it = window.addresses.most_common(1)[0]
        self.emit(
            "connection limit", limit=limit, reason=LIMIT_REASONS[limit],
            connections=window.closed, top_address=address, from_top_address=from_it,
        )  # fmt: skip
        window.closed = 0
        window.addresses.clear()
        window.last_line = now

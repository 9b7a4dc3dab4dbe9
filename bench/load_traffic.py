"""The traffic of `pdd-router bench load`: prompts sharing prefixes, prebuilt route and
streaming-completion requests, kept-alive connections, and the workers that send them
(closed loop, as fast as answered, or paced, one every period) into tallies of latency
and errors."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from bench.http_load import content_length, http_request, status_of
from bench.load_processes import Progress, auth_headers

__all__ = [
    "GROUPS",
    "ROUTE_BODIES",
    "WARMUP_S",
    "Call",
    "Connection",
    "Cycle",
    "FreshCompletions",
    "PhaseResult",
    "Prompts",
    "Requests",
    "Tally",
    "closed_loop",
    "completion_call",
    "completion_request",
    "paced_worker",
    "route_call",
    "route_requests",
    "send_one",
    "tick_progress",
]

VOCAB = 512  # engine-sim's default vocabulary: every prompt token is below it
GROUPS = 16  # conversation prefixes shared by the prompts
ROUTE_BODIES = 512  # distinct prebuilt route requests, cycled
REQUEST_TIMEOUT_S = 30.0  # one request, its whole stream included
WARMUP_S = 0.5  # each measured phase starts after this long of the same load


@dataclass(frozen=True)
class PhaseResult:
    ok: int
    errors: int
    seconds: float
    per_s: float  # answered without error, per second
    p50_ms: float  # routes: latency; completions: time to first token
    p99_ms: float


# -- prompts ------------------------------------------------------------------------------


class Prompts:
    """Distinct prompts sharing prefixes like real traffic: a system prefix common to all
    (1/8 of the tokens), one of GROUPS conversation prefixes (up to 3/4), then a tail of
    its own (1/4). Kept as JSON text: a body is the prefix's text and a fresh tail."""

    def __init__(self, tokens: int, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        system, shared = tokens // 8, tokens * 3 // 4
        self._tail = tokens - shared
        common = self._ints(system)
        self._heads = [f"{common},{self._ints(shared - system)}" for _ in range(GROUPS)]

    def _ints(self, n: int) -> str:
        return ",".join(map(str, self._rng.integers(0, VOCAB, n).tolist()))

    def tokens(self, i: int) -> str:
        """The ``i``-th prompt (of group ``i % GROUPS``) as a JSON array's inside."""
        return f"{self._heads[i % GROUPS]},{self._ints(self._tail)}"


def route_requests(prompts: Prompts, n: int) -> list[bytes]:
    return [
        http_request("/v1/route", f'{{"token_ids":[{prompts.tokens(i)}],"max_tokens":256}}'
                     .encode(), auth_headers())
        for i in range(n)
    ]  # fmt: skip


def completion_request(prompts: Prompts, i: int, output_tokens: int) -> bytes:
    rest = f'"max_tokens":{output_tokens},"ignore_eos":true,"stream":true'
    body = f'{{"prompt":[{prompts.tokens(i)}],{rest}}}'
    return http_request("/v1/completions", body.encode(), auth_headers())


# -- the client ---------------------------------------------------------------------------


class Connection:
    """One kept-alive HTTP/1.1 connection to a replica; reopened after a failure."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._io: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def io(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._io is None:
            self._io = await asyncio.open_connection("127.0.0.1", self.port)
            sock = self._io[1].get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self._io

    def close(self) -> None:
        if self._io is not None:
            self._io[1].close()
            self._io = None


Call = Callable[[Connection, bytes], Awaitable[float | None]]
"""One request on a connection: its latency figure in seconds, or None for an error."""


async def route_call(conn: Connection, request: bytes) -> float | None:
    """Latency of one route, None unless answered 200."""
    reader, writer = await conn.io()
    start = time.perf_counter()
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    await reader.readexactly(content_length(head))
    return time.perf_counter() - start if status_of(head) == 200 else None


def _chunked(head: bytes) -> bool:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"transfer-encoding":
            return b"chunked" in value.lower()
    return False


async def completion_call(conn: Connection, request: bytes) -> float | None:
    """Time to the first token of one streaming completion, None unless the stream
    answered 200 and ended with ``[DONE]``, with tokens and without an error event."""
    reader, writer = await conn.io()
    start = time.perf_counter()
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    if not _chunked(head):
        await reader.readexactly(content_length(head))
        return None
    failed, done, first = status_of(head) != 200, False, None
    pending = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        data = await reader.readexactly(size + 2)
        if size == 0:
            break
        pending += data[:-2]
        while b"\n\n" in pending:
            event, _, pending = pending.partition(b"\n\n")
            if not event.startswith(b"data: "):
                continue
            if event == b"data: [DONE]":
                done = True
                continue
            chunk = json.loads(event[6:])
            if "error" in chunk:
                failed = True
            elif first is None and any(c.get("token_ids") for c in chunk.get("choices", ())):
                first = time.perf_counter() - start
    return None if failed or not done else first


@dataclass
class Tally:
    samples: list[float] = field(default_factory=list)
    errors: int = 0
    late: int = 0

    def result(self, seconds: float) -> PhaseResult:
        if self.samples:
            p50, p99 = np.percentile(np.array(self.samples), [50, 99]) * 1e3
        else:
            p50 = p99 = float("nan")
        ok = len(self.samples)
        return PhaseResult(ok, self.errors, seconds, ok / seconds if seconds > 0 else 0.0,
                           float(p50), float(p99))  # fmt: skip


class Requests(Protocol):
    def take(self) -> bytes:
        """The next request to send."""
        ...


class Cycle:
    """Prebuilt requests, handed out in turn to every worker."""

    def __init__(self, requests: list[bytes]) -> None:
        self._requests = requests
        self._next = 0

    def take(self) -> bytes:
        request = self._requests[self._next % len(self._requests)]
        self._next += 1
        return request


class FreshCompletions:
    """Streaming completions whose prompts were never sent before (the engines keep
    storing new blocks and evicting old ones, as under real traffic)."""

    def __init__(self, prompts: Prompts, output_tokens: int) -> None:
        self._prompts = prompts
        self._output_tokens = output_tokens
        self._next = 0

    def take(self) -> bytes:
        self._next += 1
        return completion_request(self._prompts, self._next, self._output_tokens)


async def send_one(conn: Connection, call: Call, request: bytes, tally: Tally | None) -> None:
    try:
        figure = await asyncio.wait_for(call(conn, request), REQUEST_TIMEOUT_S)
    except (
        TimeoutError,
        OSError,
        asyncio.IncompleteReadError,
        asyncio.LimitOverrunError,
        ValueError,
    ):
        conn.close()
        figure = None
    if tally is None:
        return
    if figure is None:
        tally.errors += 1
    else:
        tally.samples.append(figure)


async def _closed_worker(
    conn: Connection, call: Call, cycle: Requests, until: float, tally: Tally | None
) -> None:
    while time.monotonic() < until:
        await send_one(conn, call, cycle.take(), tally)


async def paced_worker(
    conn: Connection, call: Call, cycle: Requests, period: float, offset: float, until: float,
    tally: Tally,
) -> None:  # fmt: skip
    """One request every ``period`` seconds (a request still running delays the next:
    counted late)."""
    slot = time.monotonic() + offset
    while slot < until:
        wait = slot - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        elif -wait > period:
            tally.late += 1
            slot = time.monotonic()
        await send_one(conn, call, cycle.take(), tally)
        slot += period


async def tick_progress(progress: Progress | None, what: str, start: float, total: float) -> None:
    while progress is not None:
        progress(what, min(total, time.monotonic() - start), total)
        await asyncio.sleep(0.5)


async def closed_loop(
    ports: list[int], call: Call, cycle: Requests, workers: int, seconds: float,
    progress: Progress | None, what: str,
) -> PhaseResult:  # fmt: skip
    """``workers`` connections, round robin over ``ports``, each sending its next request
    as soon as the last is answered: a warm-up, then ``seconds`` measured."""
    conns = [Connection(ports[w % len(ports)]) for w in range(workers)]
    try:
        warm = time.monotonic() + WARMUP_S
        await asyncio.gather(*(_closed_worker(c, call, cycle, warm, None) for c in conns))
        tally, start = Tally(), time.monotonic()
        ticker = asyncio.create_task(tick_progress(progress, what, start, seconds))
        try:
            until = start + seconds
            await asyncio.gather(*(_closed_worker(c, call, cycle, until, tally) for c in conns))
        finally:
            ticker.cancel()
        return tally.result(time.monotonic() - start)
    finally:
        for conn in conns:
            conn.close()

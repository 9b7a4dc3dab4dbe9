"""Slow and greedy clients against a real `serve --demo` process, with raw sockets: a
connection that sends nothing, trickles its headers or its body, or idles after a
response is closed at its deadline; connections past the cap of one address, or of the
router (fitted under its file-descriptor limit at start-up), are closed as they come in.
Meanwhile ``/healthz`` answers and a well-behaved client from another address is served,
and each limit that bites writes a log line, a few at most however many it closes."""

from __future__ import annotations

import contextlib
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from loop_support import LOOP_HELD_S, LoopReading
from process_support import free_port, terminate, wait_for

HEADER_S, BODY_S, KEEP_ALIVE_S = 1.5, 2.0, 1
MARGIN_S = 3.0  # a closure this late counts as never (a shared 2-core machine)
PER_ADDRESS = 8
FILE_LIMIT = 376  # the capped router's RLIMIT_NOFILE
# 60 client connections: each with an engine stream (60 + 60), 128 other engine calls, and
# 128 descriptors of the router's own: 376 (router/service/fd_budget.py)
CAP = 60
CHAT = {"model": "pdd-demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@dataclass
class Router:
    port: int
    log: Path

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def lines(self, limit: str) -> list[str]:
        text = re.sub(r"\x1b\[[0-9;]*m", "", self.log.read_text())
        return [x for x in text.splitlines() if "connection limit" in x and f"={limit} " in x]


@contextlib.contextmanager
def serve(folder: Path, env: dict[str, str], file_limit: int | None = None) -> Iterator[Router]:
    """``serve --demo`` with ``env`` (and RLIMIT_NOFILE ``file_limit``, set by a small
    Python that then runs the CLI: no ``preexec_fn`` in a threaded test process)."""
    port, log = free_port(), folder / "serve.log"
    launch = [sys.executable, "-m", "cli.app"]
    if file_limit is not None:
        launch = [sys.executable, "-c", "import os, resource, sys; resource.setrlimit("
                  f"resource.RLIMIT_NOFILE, ({file_limit}, {file_limit})); os.execv("
                  "sys.executable, [sys.executable, '-m', 'cli.app', *sys.argv[1:]])"]  # fmt: skip
    args = [*launch, "serve", "--demo", "--port", str(port), "--log-level", "warning"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}
        )
    try:
        wait_for(f"http://127.0.0.1:{port}/readyz", [(proc, log)], limit_s=30)
        yield Router(port, log)
    finally:
        terminate(proc)


def settings(**values: object) -> dict[str, str]:
    return {f"PDD_ROUTER_SERVICE__CONNECTIONS__{k.upper()}": str(v) for k, v in values.items()}


@pytest.fixture(scope="module")
def timed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    env = settings(header_timeout_s=HEADER_S, body_timeout_s=BODY_S, log_every_s=2,
                   keep_alive_timeout_s=KEEP_ALIVE_S, max_connections_per_address=32)  # fmt: skip
    with serve(tmp_path_factory.mktemp("timed"), env) as router:
        yield router


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    env = settings(header_timeout_s=120, max_connections_per_address=PER_ADDRESS)
    with serve(tmp_path_factory.mktemp("capped"), env, file_limit=FILE_LIMIT) as router:
        yield router


def connect(router: Router, source: str, first: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", router.port), 5, (source, 0))
    if first:
        sock.sendall(first)
    return sock


def watch(
    socks: list[socket.socket], limit_s: float, drip: Sequence[socket.socket] = ()
) -> list[float | None]:
    """Seconds until the router closed each socket (None: still open after ``limit_s``);
    the ``drip`` sockets are sent one more byte every 0.3 s meanwhile."""
    started = time.monotonic()
    closed: dict[socket.socket, float] = {}
    next_drip = started
    while len(closed) < len(socks) and time.monotonic() - started < limit_s:
        if time.monotonic() >= next_drip:
            for sock in drip:
                with contextlib.suppress(OSError):
                    sock.send(b"x")
            next_drip += 0.3
        open_ = [s for s in socks if s not in closed]
        readable, _, _ = select.select(open_, [], [], 0.05)
        for sock in readable:
            try:
                data = sock.recv(65536)
            except OSError:  # reset: closed too
                data = b""
            if not data:
                closed[sock] = time.monotonic() - started
    return [closed.get(s) for s in socks]


class WellBehaved(threading.Thread):
    """A client from 127.0.0.1 asking /healthz and a chat in turn until stopped."""

    def __init__(self, router: Router) -> None:
        super().__init__(daemon=True)
        self.router, self.stop, self.slowest = router, threading.Event(), 0.0
        self.statuses: list[int] = []

    def run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self.stop.is_set():
                started = time.perf_counter()
                self.statuses.append(client.get(self.router.url("/healthz")).status_code)
                self.slowest = max(self.slowest, time.perf_counter() - started)
                self.statuses.append(client.post(self.router.url("/v1/chat/completions"),
                                                 json=CHAT).status_code)  # fmt: skip
                time.sleep(0.1)


POST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"


def test_slow_headers_and_bodies_are_closed_at_their_deadlines(timed: Router) -> None:
    loop = LoopReading(timed.url("")).start()
    good = WellBehaved(timed)
    good.start()
    idle = [connect(timed, "127.0.0.2") for _ in range(3)]
    partial = [connect(timed, "127.0.0.2", b"GET /healthz HTTP/1.1\r\nHost: r\r\n")
               for _ in range(3)]  # fmt: skip
    trickle = connect(timed, "127.0.0.2", b"GET /healthz HTTP/1.1\r\nX-Slow: ")
    body = [connect(timed, "127.0.0.2", POST + b"Content-Length: 500\r\n\r\n{\"model\"")
            for _ in range(2)]  # fmt: skip
    heads = [*idle, *partial, trickle]
    try:
        closed = watch(heads + body, BODY_S + MARGIN_S, drip=[trickle, body[1]])
    finally:
        good.stop.set()
        good.join(timeout=15)
        for sock in heads + body:
            sock.close()
    loop.stop()
    print(f"\n/healthz slowest {good.slowest * 1e3:.1f} ms; {loop}")
    for seconds in closed[: len(heads)]:  # header deadline, trickled bytes or not
        assert seconds is not None, closed
        assert HEADER_S - 0.2 <= seconds <= HEADER_S + MARGIN_S, closed
    for seconds in closed[len(heads) :]:  # body deadline, from the complete headers
        assert seconds is not None, closed
        assert BODY_S - 0.2 <= seconds <= BODY_S + MARGIN_S, closed
    assert len(good.statuses) >= 4
    assert set(good.statuses) == {200}, good.statuses
    assert loop.held.over(LOOP_HELD_S) == 0, loop  # /healthz never waited on the slow clients
    assert_logged(timed, "header_timeout_s", len(heads), "127.0.0.2")
    assert_logged(timed, "body_timeout_s", len(body), "127.0.0.2")


def assert_logged(router: Router, limit: str, closed: int, address: str) -> None:
    """The limit's lines (a first one at once, the rest counted into one more after the
    router's 2 s interval) add up to ``closed`` connections from ``address``."""
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        lines = router.lines(limit)
        counted = sum(int(n) for x in lines for n in re.findall(r"connections=(\d+)", x))
        if counted >= closed:
            break
        time.sleep(0.2)
    assert counted == closed, lines
    assert 1 <= len(lines) <= 2, lines
    assert all(f"top_address={address}" in x for x in lines), lines


def test_an_idle_kept_alive_connection_is_closed(timed: Router) -> None:
    sock = connect(timed, "127.0.0.3", b"GET /healthz HTTP/1.1\r\nHost: r\r\n\r\n")
    try:
        sock.settimeout(10)
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert b"connection: close" not in answer.lower()  # kept alive
        [seconds] = watch([sock], KEEP_ALIVE_S + MARGIN_S)
    finally:
        sock.close()
    assert seconds is not None
    assert KEEP_ALIVE_S - 0.2 <= seconds <= KEEP_ALIVE_S + MARGIN_S


def served(router: Router, source: str) -> int | str:
    """/healthz's status asked from ``source``, or the error that ended the request."""
    transport = httpx.HTTPTransport(local_address=source)
    try:
        with httpx.Client(transport=transport, timeout=5) as client:
            return client.get(router.url("/healthz")).status_code
    except httpx.TransportError as exc:
        return type(exc).__name__


def test_connections_past_one_address_cap_are_closed_others_served(capped: Router) -> None:
    held = [connect(capped, "127.0.0.2") for _ in range(PER_ADDRESS)]
    extra: list[socket.socket] = []
    try:
        assert watch(held[:1], 0.5) == [None]  # admitted: open until their header deadline
        extra.extend(connect(capped, "127.0.0.2") for _ in range(3))
        assert all(s is not None and s < MARGIN_S for s in watch(extra, MARGIN_S))
        assert isinstance(served(capped, "127.0.0.2"), str)
        assert served(capped, "127.0.0.1") == 200
        chat = httpx.post(capped.url("/v1/chat/completions"), json=CHAT, timeout=10)
        assert chat.status_code == 200, chat.text
        assert watch(held, 0.2) == [None] * PER_ADDRESS
    finally:
        for sock in held + extra:
            sock.close()
    assert wait_served(capped, "127.0.0.2")
    [line] = capped.lines("max_connections_per_address")  # the first closure, at once
    assert "top_address=127.0.0.2" in line


def wait_served(router: Router, source: str, limit_s: float = 10) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if served(router, source) == 200:
            return True
        time.sleep(0.1)
    return False


def test_connection_cap_fits_the_file_limit_and_holds(capped: Router) -> None:
    cap = CAP
    assert f"capped at {cap} " in capped.log.read_text()
    assert wait_served(capped, "127.0.0.1")
    sources = [f"127.0.1.{i}" for i in range(cap // PER_ADDRESS + 1)]  # 64 connections
    held = [connect(capped, source) for source in sources for _ in range(PER_ADDRESS)]
    try:
        closed = watch(held, MARGIN_S)
        refused = [s for s in closed if s is not None]
        assert len(refused) == len(held) - cap, closed
        assert isinstance(served(capped, "127.0.0.1"), str)  # full: refused too
    finally:
        for sock in held:
            sock.close()
    assert wait_served(capped, "127.0.0.1")  # the descriptors came back
    [line] = capped.lines("max_connections")
    assert "reason='refused: the router holds its maximum of open connections'" in line

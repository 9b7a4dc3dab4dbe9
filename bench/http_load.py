"""HTTP for the benchmarks: a lean keep-alive client, and a load of many connections.

The router's front door is what is measured, so the client must cost next to nothing:
requests are built once as bytes (no JSON encoding per call, no client library), sent
over kept-alive HTTP/1.1 connections, and answers are read up to their Content-Length.
"""

from __future__ import annotations

import asyncio
import socket
import time

__all__ = ["RawHttp", "content_length", "http_request", "status_of", "sustained_rate"]


def http_request(path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    """A complete ``POST path`` request with a JSON body, as bytes to send."""
    lines = [f"POST {path} HTTP/1.1", "Host: bench", "Content-Type: application/json",
             f"Content-Length: {len(body)}"]  # fmt: skip
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise ValueError("an answer without Content-Length")


def status_of(head: bytes) -> int:
    return int(head.split(b" ", 2)[1])


class RawHttp:
    """One kept-alive connection; ``call`` sends a prebuilt request and reads the answer."""

    def __init__(self, port: int) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = b""

    def call(self, request: bytes) -> tuple[int, bytes]:
        self._sock.sendall(request)
        while b"\r\n\r\n" not in self._buffer:
            self._buffer += self._recv()
        head, _, rest = self._buffer.partition(b"\r\n\r\n")
        length = content_length(head)
        while len(rest) < length:
            rest += self._recv()
        self._buffer = rest[length:]
        return status_of(head), rest[:length]

    def _recv(self) -> bytes:
        chunk = self._sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        return chunk

    def close(self) -> None:
        self._sock.close()


async def _worker(port: int, request: bytes, deadline: float, counts: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.monotonic() < deadline:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(content_length(head))
            counts[0 if status_of(head) == 200 else 1] += 1
    finally:
        writer.close()


async def _load(port: int, request: bytes, seconds: float, connections: int) -> list[int]:
    counts = [0, 0]
    deadline = time.monotonic() + seconds
    await asyncio.gather(*(_worker(port, request, deadline, counts) for _ in range(connections)))
    return counts


def sustained_rate(
    port: int, request: bytes, seconds: float = 3.0, connections: int = 16
) -> tuple[float, int]:
    """Answers per second over ``seconds`` of ``connections`` clients sending ``request``
    back to back, and how many answers were not 200."""
    asyncio.run(_load(port, request, 0.5, connections))  # warm-up
    start = time.monotonic()
    ok, failed = asyncio.run(_load(port, request, seconds, connections))
    return ok / (time.monotonic() - start), failed

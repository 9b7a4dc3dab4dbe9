"""A loopback server that answers HTTP requests with hand-written bytes, and the helpers
the engine stream transport's tests share (``test_sse_transport`` and its ``_waiters``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

SSE = {"Accept": "text/event-stream"}


LENGTH = {"type": "length", "length": 2}


EVENTS = [b'data: {"t": 1}\n\n', b'data: {"t": 2}\n\n', b"data: [DONE]\n\n"]


def chunked(*pieces: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
    return head + body + b"0\r\n\r\n"


class Server:
    """A loopback server answering requests in turn with ``answers`` (None: the connection
    is closed instead of answering; an answer in ``closing``: closed after it), keeping
    each request it read."""

    def __init__(
        self,
        answers: list[bytes | None],
        *,
        pause_s: float = 0.0,
        closing: int = -1,
        wait_s: dict[int, float] | None = None,
        piece_bytes: int = 40,
    ) -> None:
        self.answers = answers
        self.pause_s = pause_s
        self.wait_s = wait_s or {}  # by the request's index: seconds silent before answering
        self.piece_bytes = piece_bytes
        self.closing = closing  # the index of the answer after which the server closes
        self.answered = 0
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed = asyncio.Event()  # a connection saw its peer close it

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                self.requests.append(head + await reader.readexactly(length))
                answer = self.answers.pop(0)
                if answer is None:
                    return
                await asyncio.sleep(self.wait_s.get(len(self.requests) - 1, 0.0))
                step = self.piece_bytes
                for i in range(0, len(answer), step):  # cut anywhere, sent over time
                    writer.write(answer[i : i + step])
                    await writer.drain()
                    if self.pause_s:
                        await asyncio.sleep(self.pause_s)
                self.answered += 1
                if self.answered - 1 == self.closing:
                    return
            if await reader.read() == b"":
                self.closed.set()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed.set()
        finally:
            writer.close()


@asynccontextmanager
async def serving(server: Server) -> AsyncIterator[str]:
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        listener.close()


async def read_stream(
    http: httpx.AsyncClient, url: str, timeout: httpx.Timeout | None = None
) -> tuple[int, bytes]:
    given = httpx.USE_CLIENT_DEFAULT if timeout is None else timeout
    async with http.stream(
        "POST", url + "/v1/completions", json={"a": 1}, headers=SSE, timeout=given
    ) as r:
        return r.status_code, b"".join([piece async for piece in r.aiter_bytes()])

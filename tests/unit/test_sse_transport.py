"""The engines' event streams on connections of their own (``SseTransport``), against a
loopback server that answers with hand-written HTTP: the body as sent whatever its framing,
a connection kept alive for the next stream and closed under a stream left early, a
stale kept-alive connection replaced, httpx's errors and timeouts, other requests passed
on to the fallback transport."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from engines_adapter.sse_transport import SseTransport

SSE = {"Accept": "text/event-stream"}
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
        self, answers: list[bytes | None], *, pause_s: float = 0.0, closing: int = -1
    ) -> None:
        self.answers = answers
        self.pause_s = pause_s
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
                for i in range(0, len(answer), 40):  # cut anywhere, sent over time
                    writer.write(answer[i : i + 40])
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


def client(fallback: httpx.AsyncBaseTransport | None = None, **timeout: float) -> httpx.AsyncClient:
    inner = fallback or httpx.MockTransport(lambda r: httpx.Response(418))
    return httpx.AsyncClient(
        transport=SseTransport(inner, max_connections=4),
        timeout=httpx.Timeout(timeout.get("read", 5.0), **timeout),
    )


async def read_stream(http: httpx.AsyncClient, url: str) -> tuple[int, bytes]:
    async with http.stream("POST", url + "/v1/completions", json={"a": 1}, headers=SSE) as r:
        return r.status_code, b"".join([piece async for piece in r.aiter_bytes()])


async def test_a_chunked_stream_is_read_as_sent_and_its_connection_kept_for_the_next() -> None:
    server = Server([chunked(*EVENTS), chunked(EVENTS[0])])
    async with serving(server) as url, client() as http:
        assert await read_stream(http, url) == (200, b"".join(EVENTS))
        assert await read_stream(http, url) == (200, EVENTS[0])
    assert server.connections == 1
    request = server.requests[0]
    assert request.startswith(b"POST /v1/completions HTTP/1.1\r\n")
    assert b"\r\nAccept: text/event-stream\r\n" in request
    assert request.endswith(b'\r\n\r\n{"a":1}')


async def test_a_body_of_given_length_and_one_ended_by_the_close_are_read_whole() -> None:
    sized = b"HTTP/1.1 200 OK\r\ncontent-length: 14\r\n\r\n" + EVENTS[0][:14]
    closing = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n" + EVENTS[1]
    server = Server([sized, closing], closing=1)
    async with serving(server) as url, client() as http:
        assert await read_stream(http, url) == (200, EVENTS[0][:14])
        assert await read_stream(http, url) == (200, EVENTS[1])


async def test_an_error_status_and_its_body_reach_the_caller() -> None:
    body = b'{"error": {"message": "no"}}'
    answer = b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    async with serving(Server([answer])) as url, client() as http:
        assert await read_stream(http, url) == (429, body)


async def test_a_stream_left_early_closes_its_connection_and_the_next_opens_another() -> None:
    server = Server([chunked(*EVENTS * 50), chunked(EVENTS[2])], pause_s=0.01)
    async with serving(server) as url, client() as http:
        async with http.stream("POST", url + "/x", json={}, headers=SSE) as response:
            async for _ in response.aiter_bytes():
                break
        await asyncio.wait_for(server.closed.wait(), 5.0)  # the engine sees the drop
        assert await read_stream(http, url) == (200, EVENTS[2])
    assert server.connections == 2


async def test_a_kept_alive_connection_the_engine_closed_is_replaced_once() -> None:
    server = Server([chunked(EVENTS[0]), None, chunked(EVENTS[1])])
    async with serving(server) as url, client() as http:
        assert await read_stream(http, url) == (200, EVENTS[0])
        assert await read_stream(http, url) == (200, EVENTS[1])
    assert server.connections == 2


async def test_a_stream_cut_midway_is_a_remote_protocol_error() -> None:
    cut = chunked(*EVENTS)[:-20]
    server = Server([cut], closing=0)
    async with serving(server) as url, client() as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await read_stream(http, url)


async def test_an_engine_that_stays_silent_is_a_read_timeout() -> None:
    server = Server([chunked(*EVENTS)], pause_s=0.5)
    async with serving(server) as url, client(read=0.1) as http:
        with pytest.raises(httpx.ReadTimeout):
            await read_stream(http, url)


async def test_a_stream_whose_tokens_keep_coming_outlives_its_read_timeout() -> None:
    events = chunked(*EVENTS * 4)  # 16 pieces of 40 bytes, 0.05 s apart: 0.8 s in all
    async with serving(Server([events], pause_s=0.05)) as url, client(read=0.3) as http:
        assert await read_stream(http, url) == (200, b"".join(EVENTS * 4))


async def test_a_stream_that_stops_midway_is_a_read_timeout() -> None:
    server = Server([chunked(*EVENTS)[:80]], pause_s=0.05)  # then silent, still open
    async with serving(server) as url, client(read=0.3) as http:
        got: list[bytes] = []

        async def read() -> None:
            async with http.stream("POST", url + "/x", json={}, headers=SSE) as response:
                async for piece in response.aiter_bytes():
                    got.append(piece)

        with pytest.raises(httpx.ReadTimeout):
            await read()
    assert b"".join(got).startswith(EVENTS[0])  # the body came, then the silence


async def test_no_engine_listening_is_a_connect_error() -> None:
    async with serving(Server([])) as url:
        pass  # the port is free again
    async with client() as http:
        with pytest.raises(httpx.ConnectError):
            await read_stream(http, url)


async def test_other_requests_go_to_the_fallback_transport() -> None:
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        return httpx.Response(200, json={"ok": True})

    async with client(httpx.MockTransport(answer)) as http:
        assert (await http.get("http://127.0.0.1:1/metrics")).json() == {"ok": True}
        assert (await http.post("http://127.0.0.1:1/v1/completions", json={})).status_code == 200
    assert seen == ["GET /metrics", "POST /v1/completions"]


async def test_streams_beyond_the_cap_wait_for_a_connection_then_time_out() -> None:
    server = Server([chunked(*EVENTS * 20)] * 5, pause_s=0.05)
    async with serving(server) as url:
        http = httpx.AsyncClient(
            transport=SseTransport(httpx.MockTransport(lambda r: httpx.Response(418)), 1),
            timeout=httpx.Timeout(5.0, pool=0.1),
        )
        async with http, http.stream("POST", url + "/x", json={}, headers=SSE) as first:
            with pytest.raises(httpx.PoolTimeout):
                await read_stream(http, url)
            assert first.status_code == 200

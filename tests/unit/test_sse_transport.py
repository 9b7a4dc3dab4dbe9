"""The engines' event streams on connections of their own (``SseTransport``), against a
loopback server that answers with hand-written HTTP: the body as sent whatever its framing,
a connection kept alive for the next stream and closed under a stream left early, a
request never sent twice, a closed kept-alive connection not reused, httpx's errors and
timeouts, other requests passed on to the fallback transport."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sse_server import EVENTS, LENGTH, SSE, Server, chunked, read_stream, serving

from engines_adapter.contract import GenerateRequest
from engines_adapter.sglang import SGLangAdapter
from engines_adapter.sse_connection import PAUSE_BYTES
from engines_adapter.sse_transport import SseTransport


def client(
    fallback: httpx.AsyncBaseTransport | None = None, cap: int = 4, **timeout: float
) -> httpx.AsyncClient:
    inner = fallback or httpx.MockTransport(lambda r: httpx.Response(418))
    return httpx.AsyncClient(
        transport=SseTransport(inner, max_connections=cap),
        timeout=httpx.Timeout(timeout.get("read", 5.0), **timeout),
    )


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


async def test_the_responses_protocol_version_is_the_engines() -> None:
    old = b"HTTP/1.0 200 OK\r\nconnection: close\r\n\r\n" + EVENTS[0]
    server = Server([chunked(EVENTS[1]), old], closing=1)
    async with serving(server) as url, client() as http:
        versions = []
        for _ in range(2):
            async with http.stream("POST", url + "/x", json={}, headers=SSE) as response:
                await response.aread()
                versions.append(response.http_version)
    assert versions == ["HTTP/1.1", "HTTP/1.0"]


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


async def test_an_engine_that_reads_a_request_then_closes_gets_it_once() -> None:
    """The engine may have started on a request it read before closing: sending it again
    would generate it twice (httpx's own transport does not either)."""
    server = Server([chunked(EVENTS[0]), None, chunked(EVENTS[1])])
    async with serving(server) as url, client() as http:
        assert await read_stream(http, url) == (200, EVENTS[0])
        with pytest.raises(httpx.RemoteProtocolError):
            await read_stream(http, url)  # on the kept-alive connection, read and dropped
        assert await read_stream(http, url) == (200, EVENTS[1])  # a new connection
    assert len(server.requests) == 3  # the second request sent once
    assert server.connections == 2


async def test_a_kept_alive_connection_whose_close_is_not_yet_handled_is_not_reused() -> None:
    """The engine's close may arrive as a stream takes the idle connection, before the
    loop has handled it: the socket is readable, so a new connection is made instead."""
    server = Server([chunked(EVENTS[0]), chunked(EVENTS[1])], closing=0)
    async with serving(server) as url:
        transport = SseTransport(httpx.MockTransport(lambda r: httpx.Response(418)), 4)
        async with httpx.AsyncClient(transport=transport, timeout=5.0) as http:
            assert await read_stream(http, url) == (200, EVENTS[0])
            (idle,) = transport._idle[("127.0.0.1", int(url.rsplit(":", 1)[1]))]
            assert idle.transport is not None
            idle.transport.pause_reading()  # the loop will not see the close come in
            for _ in range(100):  # the server closes once it answered: at most 5 s
                if idle.closed_by_peer():
                    break
                await asyncio.sleep(0.05)
            assert idle.closed_by_peer()
            assert not idle.lost
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


async def read_while_another_waits(
    http: httpx.AsyncClient, url: str, other_url: str
) -> tuple[bytes, tuple[int, bytes]]:
    """The body of a stream to ``url`` read whole while one to ``other_url`` waits for
    a connection, and what the waiting one read."""
    async with http.stream("POST", url + "/x", json={}, headers=SSE) as first:
        waiting = asyncio.create_task(read_stream(http, other_url))
        body = b"".join([piece async for piece in first.aiter_bytes()])
    return body, await waiting


async def test_a_stream_waiting_for_the_one_connection_takes_it_once_the_first_ends() -> None:
    server = Server([chunked(*EVENTS * 4), chunked(EVENTS[1])], pause_s=0.02)
    async with serving(server) as url, client(cap=1, pool=5.0) as http:
        got = await read_while_another_waits(http, url, url)
    assert got == (b"".join(EVENTS * 4), (200, EVENTS[1]))
    assert server.connections == 1  # the second reused the first's connection


async def test_a_stream_waiting_for_another_engine_closes_an_idle_connection_for_room() -> None:
    one = Server([chunked(*EVENTS * 4)], pause_s=0.02)
    other = Server([chunked(EVENTS[1])])
    async with (
        serving(one) as url_one,
        serving(other) as url_other,
        client(cap=1, pool=5.0) as http,
    ):
        got = await read_while_another_waits(http, url_one, url_other)
        assert got == (b"".join(EVENTS * 4), (200, EVENTS[1]))
        await asyncio.wait_for(one.closed.wait(), 5.0)  # closed idle to make room


async def test_a_reused_connection_keeps_no_read_deadline_of_the_last_request() -> None:
    server = Server([chunked(EVENTS[0]), chunked(EVENTS[1])], wait_s={1: 0.6})
    async with serving(server) as url, client() as http:
        assert await read_stream(http, url, httpx.Timeout(5.0, read=0.3)) == (200, EVENTS[0])
        assert await read_stream(http, url, httpx.Timeout(5.0, read=None)) == (200, EVENTS[1])
    assert server.connections == 1


async def test_a_shorter_read_timeout_on_a_reused_connection_goes_off_in_its_time() -> None:
    server = Server([chunked(EVENTS[0]), chunked(EVENTS[1])], wait_s={1: 1.0})
    async with serving(server) as url, client() as http:
        assert await read_stream(http, url, httpx.Timeout(5.0, read=30.0)) == (200, EVENTS[0])
        with pytest.raises(httpx.ReadTimeout):  # not 30 s after the first request
            await read_stream(http, url, httpx.Timeout(5.0, read=0.2))


async def test_a_connection_idle_past_its_keep_alive_is_closed_not_reused() -> None:
    server = Server([chunked(EVENTS[0]), chunked(EVENTS[1])])
    async with serving(server) as url:
        transport = SseTransport(httpx.MockTransport(lambda r: httpx.Response(418)), 4, 0.1)
        async with httpx.AsyncClient(transport=transport) as http:
            assert await read_stream(http, url) == (200, EVENTS[0])
            await asyncio.sleep(0.3)
            assert await read_stream(http, url) == (200, EVENTS[1])
            await asyncio.wait_for(server.closed.wait(), 5.0)  # the router closed the first
    assert server.connections == 2


async def test_a_connection_paused_under_an_unread_body_is_not_reused() -> None:
    big = chunked(b"x" * (PAUSE_BYTES + 10))
    server = Server([big, chunked(EVENTS[1])], piece_bytes=len(big))
    async with serving(server) as url, client(read=2.0) as http:
        async with http.stream("POST", url + "/x", json={}, headers=SSE) as response:
            await asyncio.sleep(0.3)  # all of it comes; none is read
            assert response.status_code == 200
        assert await read_stream(http, url) == (200, EVENTS[1])
    assert server.connections == 2


async def test_a_connect_cut_short_counts_its_connection_out_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    real = loop.create_connection

    async def cut(factory: Any, *args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(loop, "create_connection", real)  # the next connects
        factory().connection_lost(ConnectionResetError())  # closed under the connect
        raise ConnectionResetError("reset while connecting")  # which then fails

    monkeypatch.setattr(loop, "create_connection", cut)
    server = Server([chunked(*EVENTS * 20)] * 2, pause_s=0.05)
    async with serving(server) as url, client(cap=1, pool=0.1) as http:
        with pytest.raises(httpx.ConnectError):
            await read_stream(http, url)
        async with http.stream("POST", url + "/x", json={}, headers=SSE) as first:
            with pytest.raises(httpx.PoolTimeout):  # the cap of 1 still holds
                await read_stream(http, url)
            assert first.status_code == 200


async def test_an_sglang_generate_goes_on_the_stream_connections() -> None:
    others: list[str] = []

    def fallback(request: httpx.Request) -> httpx.Response:
        others.append(request.url.path)
        return httpx.Response(418)

    first = {"output_ids": [7], "meta_info": {"completion_tokens": 1}}
    last = {"output_ids": [8], "meta_info": {"completion_tokens": 2, "finish_reason": LENGTH}}
    events = [b"data: %s\n\n" % json.dumps(chunk).encode() for chunk in (first, last)]
    server = Server([chunked(*events)])
    request = GenerateRequest(request_id="r1", prompt_token_ids=[1, 2], max_tokens=2)
    async with serving(server) as url, client(httpx.MockTransport(fallback)) as http:
        adapter = SGLangAdapter("s0", url, client=http)
        deltas = [delta async for delta in adapter.generate(request)]
    assert [t for d in deltas for t in d.token_ids] == [7, 8]
    assert others == []
    assert server.requests[0].startswith(b"POST /generate HTTP/1.1\r\n")


async def test_an_interim_answer_is_skipped_and_the_next_stream_gets_its_own_body() -> None:
    early_hints = b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n"
    server = Server(  # the interim answer alone in the first piece, the rest 0.1 s later
        [early_hints + chunked(EVENTS[0]), chunked(EVENTS[1])],
        piece_bytes=len(early_hints), pause_s=0.1,
    )  # fmt: skip
    async with serving(server) as url, client() as http:
        assert await read_stream(http, url) == (200, EVENTS[0])
        assert await read_stream(http, url) == (200, EVENTS[1])
    assert server.connections == 1


async def test_a_header_with_a_line_break_is_refused_before_it_is_sent() -> None:
    server = Server([chunked(EVENTS[0])])
    async with serving(server) as url, client() as http:
        with pytest.raises(httpx.LocalProtocolError, match="illegal header"):
            await http.post(url, headers={**SSE, "x-request-id": "r1\r\nx-injected: yes"})
    assert server.requests == []


async def test_a_chunked_upload_or_an_expect_goes_to_the_fallback_transport() -> None:
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("transfer-encoding") or request.headers["expect"])
        return httpx.Response(200)

    async def pieces() -> AsyncIterator[bytes]:
        yield b"{}"

    async with client(httpx.MockTransport(answer)) as http:
        url = "http://127.0.0.1:1/v1/completions"
        assert (await http.post(url, content=pieces(), headers=SSE)).status_code == 200
        expect = {**SSE, "expect": "100-continue"}
        assert (await http.post(url, json={}, headers=expect)).status_code == 200
    assert seen == ["chunked", "100-continue"]


async def test_a_stream_read_after_the_transport_closed_closes_its_connection() -> None:
    server = Server([chunked(*EVENTS)], pause_s=0.05)
    transport = SseTransport(httpx.MockTransport(lambda r: httpx.Response(418)), 4)
    async with serving(server) as url:
        http = httpx.AsyncClient(transport=transport, timeout=5.0)
        async with http.stream("POST", url, json={}, headers=SSE) as r:
            await transport.aclose()  # shutting down while a stream is being read
            assert b"".join([p async for p in r.aiter_bytes()]) == b"".join(EVENTS)
        await asyncio.wait_for(server.closed.wait(), 5)  # not kept idle for ever

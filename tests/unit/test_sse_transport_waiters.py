"""Streams waiting for one of ``SseTransport``'s connections: served in the order they
came, each release waking one of them (the work per stream does not grow with the
crowd), a waiter woken then cancelled passing its turn on, a pool timeout leaving the
line, and connections closed while idle leaving the idle lists at once."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from sse_server import EVENTS, SSE, Server, chunked, read_stream, serving

from engines_adapter.sse_connection import Connection
from engines_adapter.sse_transport import SseTransport


def transport(cap: int) -> SseTransport:
    return SseTransport(httpx.MockTransport(lambda r: httpx.Response(418)), cap)


def tagged(i: int) -> bytes:
    return b"data: %d\n\n" % i


async def queue_up(
    pool: SseTransport, http: httpx.AsyncClient, url: str, n: int, pool_s: float = 5.0
) -> list[asyncio.Task[tuple[int, bytes]]]:
    """``n`` streams to ``url`` started one after the other, each once the last waits
    (at most ``pool_s`` seconds for a connection)."""
    tasks = []
    for _ in range(n):
        given = httpx.Timeout(5.0, pool=pool_s)
        tasks.append(asyncio.create_task(read_stream(http, url, given)))
        while pool.waiting < len(tasks):
            assert not tasks[-1].done(), "a stream did not wait"
            await asyncio.sleep(0)
    return tasks


async def test_streams_waiting_for_the_one_connection_get_it_in_the_order_they_came() -> None:
    n = 8
    answers: list[bytes | None] = [chunked(EVENTS[0]), *(chunked(tagged(i)) for i in range(n))]
    server = Server(answers)
    pool = transport(1)
    async with serving(server) as url, httpx.AsyncClient(transport=pool, timeout=5.0) as http:
        async with http.stream("POST", url, json={}, headers=SSE) as first:
            waiting = await queue_up(pool, http, url, n)
            assert b"".join([p async for p in first.aiter_bytes()]) == EVENTS[0]
        got = await asyncio.gather(*waiting)
    # the engine answers in the order it is asked: the i-th to come was the i-th served
    assert got == [(200, tagged(i)) for i in range(n)]
    assert server.connections == 1


@pytest.mark.parametrize("n", [50, 200])
async def test_each_stream_looks_for_an_idle_connection_once_however_many_wait(
    n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream looks at the idle lists when it comes and nobody waits, or when it is
    woken; a wake follows a connection parked or closed, one per stream's end: at most
    2 looks per stream, where one event waking every waiter made it grow with n."""
    pool = transport(2)
    looks = 0
    look = pool._take_idle

    def counted(key: tuple[str, int]) -> Connection | None:
        nonlocal looks
        looks += 1
        return look(key)

    monkeypatch.setattr(pool, "_take_idle", counted)
    server = Server([chunked(*EVENTS)] * n)
    client = httpx.AsyncClient(transport=pool, timeout=httpx.Timeout(60.0))
    async with serving(server) as url, client as http:
        got = await asyncio.gather(*(read_stream(http, url) for _ in range(n)))
    assert got == [(200, b"".join(EVENTS))] * n
    assert server.connections == 2
    assert looks <= 2 * n


async def test_a_waiter_woken_then_cancelled_passes_the_connection_to_the_next() -> None:
    server = Server([chunked(*EVENTS * 4), chunked(EVENTS[1])], pause_s=0.02)
    pool = transport(1)
    async with serving(server) as url, httpx.AsyncClient(transport=pool) as http:
        async with http.stream("POST", url, json={}, headers=SSE) as first:
            woken, next_one = await queue_up(pool, http, url, 2, pool_s=3.0)
            # read to its end, the body hands its connection back: the oldest is woken
            assert b"".join([p async for p in first.aiter_bytes()]) == b"".join(EVENTS * 4)
            assert not woken.done()  # woken, not run yet
            assert pool.waiting == 2
            woken.cancel()
        assert await next_one == (200, EVENTS[1])  # not a PoolTimeout 3 s later
        with pytest.raises(asyncio.CancelledError):
            await woken
        assert pool.waiting == 0
    assert server.connections == 1


async def test_a_waiter_timing_out_leaves_the_line_and_the_one_behind_is_served() -> None:
    server = Server([chunked(*EVENTS * 10), chunked(EVENTS[1])], pause_s=0.05)
    pool = transport(1)
    async with serving(server) as url, httpx.AsyncClient(transport=pool, timeout=5.0) as http:
        async with http.stream("POST", url, json={}, headers=SSE) as first:
            [short] = await queue_up(pool, http, url, 1, pool_s=0.1)
            [patient] = await queue_up(pool, http, url, 1)
            with pytest.raises(httpx.PoolTimeout):
                await short
            assert pool.waiting == 1
            assert b"".join([p async for p in first.aiter_bytes()]) == b"".join(EVENTS * 10)
        assert await patient == (200, EVENTS[1])
    assert pool.waiting == 0


async def test_a_connection_closed_for_room_leaves_its_idle_list_at_once() -> None:
    one, other = Server([chunked(EVENTS[0])]), Server([chunked(EVENTS[1])], pause_s=0.05)
    pool = transport(1)
    async with (
        serving(one) as url_one,
        serving(other) as url_other,
        httpx.AsyncClient(transport=pool, timeout=5.0) as http,
    ):
        assert await read_stream(http, url_one) == (200, EVENTS[0])
        assert pool.idle_connections == 1
        async with http.stream("POST", url_other, json={}, headers=SSE) as second:
            assert pool.idle_connections == 0  # the one to the first engine closed for room
            assert b"".join([p async for p in second.aiter_bytes()]) == EVENTS[1]
        assert pool.idle_connections == 1
        await asyncio.wait_for(one.closed.wait(), 5.0)


async def test_a_connection_the_engine_closed_while_idle_leaves_its_idle_list() -> None:
    server = Server([chunked(EVENTS[0])], closing=0)  # closes the connection once answered
    pool = transport(2)
    async with serving(server) as url, httpx.AsyncClient(transport=pool, timeout=5.0) as http:
        assert await read_stream(http, url) == (200, EVENTS[0])
        async with asyncio.timeout(5.0):
            while pool.idle_connections:  # until the close reaches the router
                await asyncio.sleep(0.01)

"""A streamed engine response is closed, and leaves httpx's pool, however often its task
is cancelled while it closes; so does a plain request cancelled at any step.

anyio's shield does not stop asyncio's own ``Task.cancel`` (a timeout, an abort, a client
that left, each cancelling once): a cancel that landed inside the close left httpcore's
pool holding the request for good, which a soak showed as a steady leak (about one
streamed completion in forty, with the connection objects it kept)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from engines_adapter.http_engine import open_stream, run_scoped

Answer = Callable[[asyncio.StreamWriter], Awaitable[bool]]


@contextlib.asynccontextmanager
async def local_server(answer: Answer, path: str) -> AsyncIterator[str]:
    """A loopback HTTP/1.1 server: ``answer`` writes the reply to each request's head (the
    body is not read) and says whether the connection stays open for another."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    pass
                if not line or not await answer(writer):
                    break
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}{path}"
    finally:
        server.close()
        await server.wait_closed()


async def endless_stream(writer: asyncio.StreamWriter) -> bool:
    """A chunked body that never ends (a line every 5 ms), as an engine streaming a long
    answer sends."""
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                 b"transfer-encoding: chunked\r\n\r\n")  # fmt: skip
    line = b'data: {"x": 1}\n'
    while True:
        writer.write(b"%x\r\n%s\r\n" % (len(line), line))
        await writer.drain()
        await asyncio.sleep(0.005)


async def small_json(writer: asyncio.StreamWriter) -> bool:
    """A small JSON body at once, the connection kept alive."""
    body = b'{"ok": 1}'
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
    await writer.drain()
    return True


def pending_requests(client: httpx.AsyncClient) -> int:
    """Requests httpx's connection pool still holds (none once every response is closed)."""
    return len(client._transport._pool._requests)  # type: ignore[attr-defined]


async def read_some(
    client: httpx.AsyncClient, url: str, lines: int, started: asyncio.Event
) -> None:
    """Read ``lines`` lines of an endless stream and leave (as a consumer does at [DONE]:
    the rest of the body unread, so the connection closes), or wait to be cancelled.
    Leaving, it has itself cancelled at the loop's next step, inside the close: what the
    consumer of an engine's stream does when the final token reaches it first."""
    async with open_stream(client, "POST", url, json={}) as response:
        async for _ in response.aiter_lines():
            started.set()
            lines -= 1
            if lines == 0:
                task = asyncio.current_task()
                assert task is not None
                asyncio.get_running_loop().call_soon(task.cancel)
                break


@pytest.mark.parametrize("lines", [1, 10**9], ids=["left-after-a-line", "reading"])
async def test_a_stream_cancelled_while_it_closes_leaves_the_pool(lines: int) -> None:
    """The task reading a stream is cancelled at every step of the event loop until it
    ends: while it reads (its close then starts from the cancel) or while it closes the
    stream it left early (the cancel lands inside the close, at anyio's checkpoint)."""
    async with (
        local_server(endless_stream, "/v1/completions") as url,
        httpx.AsyncClient() as client,
    ):
        for _ in range(20):
            started = asyncio.Event()
            task = asyncio.create_task(read_some(client, url, lines, started))
            await asyncio.wait_for(started.wait(), 10)
            for _ in range(1000):
                if task.done():
                    break
                task.cancel()
                await asyncio.sleep(0)
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 10)
        assert pending_requests(client) == 0


async def test_a_request_cancelled_at_any_step_leaves_the_pool() -> None:
    """A request (as the adapters send a prefill or a probe: ``run_scoped``) cancelled at
    each step of the event loop in turn, from its start to its answer: a plain
    ``client.get`` cancelled inside its own close (step 15 on this machine) left a request
    in the pool; through ``run_scoped`` none is left at any step."""
    async with local_server(small_json, "/metrics") as url, httpx.AsyncClient() as client:
        answered = 0
        for step in range(300):
            task = asyncio.create_task(run_scoped(lambda: client.get(url)))
            for _ in range(step):
                await asyncio.sleep(0)
            task.cancel()
            try:
                response = await asyncio.wait_for(task, 10)
            except asyncio.CancelledError:
                continue
            answered += response.status_code == 200
        assert pending_requests(client) == 0
        assert 0 < answered < 300  # cancelled before, during and after the exchange

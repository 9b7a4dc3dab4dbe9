"""`replay live` sends requests due at the same moment in the trace's order: a real server
receives each one's whole body before the next one's. (Bodies of tens of kilobytes, as
prompts of thousands of tokens make: a server reads a body of megabytes in pieces, and a
tiny one sent after it can still be read first.)"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from e2e.process_support import free_port
from replay.runner.live import LiveOptions, run_live
from replay.trace.record import TraceRequest

TOKEN = {"choices": [{"index": 0, "token_ids": [7], "text": ""}]}


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, list[int]]]:
    """An endpoint noting the prompt length of each request as its body has arrived."""
    app = FastAPI()
    received: list[int] = []

    @app.get("/v1/models")
    async def models() -> dict[str, list[object]]:
        return {"data": []}

    @app.post("/v1/completions")
    async def completions(request: Request) -> StreamingResponse:
        received.append(len(json.loads(await request.body())["prompt"]))

        async def events() -> AsyncIterator[str]:
            yield f"data: {json.dumps(TOKEN)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    assert server.started
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_requests_due_together_arrive_in_the_traces_order(
    server: tuple[str, list[int]],
) -> None:
    """Three requests leave three connections open; then eight are due at once, prompts of
    thousands of tokens alternating with tiny ones. Sent side by side, those that reused a
    connection and the tiny ones got ahead of the rest (the server took them 8000, 8, 6000,
    8, 4000, 8, 8, 2000): in the trace's order, an engine serving first come, first served
    would make others wait than the replay does."""
    url, received = server
    sizes = [8000, 8, 4000, 8, 6000, 8, 2000, 8]
    warm = [TraceRequest(i, 0.0, 8, 1, (), 16) for i in range(3)]
    burst = [TraceRequest(3 + i, 0.3, n, 1, (), 16) for i, n in enumerate(sizes)]
    for _ in range(3):
        received.clear()
        result = run_live([*warm, *burst], LiveOptions(url=url, vocab_size=512, concurrency=16))
        assert [r.tokens_md for r in result.records] == [1] * 11
        assert received[3:] == sizes

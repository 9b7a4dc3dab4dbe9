"""An OpenAI-like endpoint that notes the prompt length of each completion request as its
body has arrived (``GET /received``; ``DELETE /received`` clears it), run as a process of
its own: ``python arrival_order_server.py PORT``."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

TOKEN = {"choices": [{"index": 0, "token_ids": [7], "text": ""}]}

app = FastAPI()
received: list[int] = []


@app.get("/v1/models")
async def models() -> dict[str, list[object]]:
    return {"data": []}


@app.get("/received")
async def arrivals() -> list[int]:
    return received


@app.delete("/received")
async def clear() -> None:
    received.clear()


@app.post("/v1/completions")
async def completions(request: Request) -> StreamingResponse:
    received.append(len(json.loads(await request.body())["prompt"]))

    async def events() -> AsyncIterator[str]:
        yield f"data: {json.dumps(TOKEN)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error")

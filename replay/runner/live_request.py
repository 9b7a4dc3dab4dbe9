"""One request of a live run: its body, its turn to be taken by the server, and what the
client saw of its answer (status, pipeline, tokens and their times, an error)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec

from engines_adapter.http_engine import decode_json, sse_payloads
from replay.runner.endpoint import tokens_in_chunk
from replay.runner.live_failures import error_message
from replay.trace.record import TraceRequest

__all__ = ["InOrder", "Seen", "request_body", "send_request"]


@dataclass(slots=True)
class Seen:
    """What the client saw of one request; times from the run's start."""

    request: TraceRequest
    arrival_s: float
    first_s: float | None = None
    last_s: float | None = None
    tokens: int = 0  # counted in the stream
    reported_tokens: int | None = None  # the endpoint's usage.completion_tokens
    max_gap_s: float = 0.0
    pipeline: str = ""
    instances: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    rejected: str | None = None  # refused by admission control (429): the bottleneck named
    send_lag_s: float | None = None  # sent this long after it was due (slot wait left out)


def request_body(model: str | None, prompt: list[int], output_length: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": max(output_length, 1),
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,  # vLLM (and engine-sim): count tokens, not text pieces
    }
    if model is not None:
        body["model"] = model
    return body


class Turn:
    """One request's turn to send: ``release`` (idempotent) lets the next one go."""

    def __init__(self, lock: asyncio.Lock) -> None:
        self._lock: asyncio.Lock | None = lock

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None


class InOrder:
    """Requests taken by the server one after another, then answered together: a request
    holds the turn (a fair lock: taken in the order asked) from its connection until its
    answer's headers arrive (the server has read the whole request) or it fails. Releasing
    the turn once the body was handed to the socket still let a server read a later, tiny
    request first: with two sockets readable it may finish the small body while a large
    one is still arriving in pieces. Waiting for the headers costs the server's time to
    take a request (about a millisecond on loopback) per request of a burst."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    async def take(self) -> Turn:
        await self._lock.acquire()
        return Turn(self._lock)


async def send_request(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], seen: Seen, t0: float,
    order: InOrder,
) -> None:  # fmt: skip
    """POST ``body`` to ``url``'s ``/v1/completions`` in its turn; the answer into ``seen``."""
    turn = await order.take()
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            turn.release()
            await _read(response, seen, t0)
    finally:
        turn.release()
    if seen.first_s is None and seen.error is None and seen.rejected is None:
        seen.error = "no tokens"


async def _read(response: httpx.Response, seen: Seen, t0: float) -> None:
    """The answer's status, then its stream of tokens, into ``seen``."""
    if response.status_code != 200:
        await response.aread()
        refused_by = response.headers.get("x-pdd-bottleneck")  # the router's admission
        if refused_by is not None or response.status_code == 429:  # control refused it
            seen.rejected = refused_by or "overloaded"
        else:
            message = error_message(response.content)
            seen.error = f"HTTP {response.status_code}" + (f": {message}" if message else "")
        return
    seen.pipeline = response.headers.get("x-pdd-pipeline", "")
    async for data in sse_payloads(response):
        if data == b"[DONE]":
            continue
        try:
            chunk = decode_json(data)
        except msgspec.DecodeError:
            continue  # not an event of the completion (a proxy's keep-alive, say)
        if not isinstance(chunk, dict):
            continue
        if "error" in chunk:
            message = error_message(chunk)
            seen.error = "stream error" + (f": {message}" if message else "")
            return
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            seen.reported_tokens = usage["completion_tokens"]
        served = chunk.get("pdd")
        if isinstance(served, dict):
            seen.pipeline = str(served.get("pipeline") or seen.pipeline)
            seen.instances = dict(served.get("instances") or {})
        tokens = tokens_in_chunk(chunk)
        if tokens == 0:
            continue
        now = time.perf_counter() - t0
        if seen.last_s is not None:
            seen.max_gap_s = max(seen.max_gap_s, now - seen.last_s)
        else:
            seen.first_s = now
        seen.last_s = now
        seen.tokens += tokens

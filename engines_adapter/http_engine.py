"""What the HTTP adapters share: error mapping, SSE parsing, abortable streams.

Errors become ``EngineError`` with a cause: connection failures are ``unreachable``;
timeouts, 5xx, 408 and 425 are the ``instance``'s (another may serve); a 429 says the
engine is ``busy`` (back-pressure: another may serve, and it counts as load); other 4xx
(a request the engine will never accept) are the ``request``'s, with the engine's
message as the reason the client is told. A streamed generation runs in a task
that feeds a channel, so ``abort`` can cancel it (closing the HTTP stream, which makes
vLLM and SGLang abort the request) while the consumer sees a clean final delta.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
import httpx
import msgspec

from engines_adapter.contract import EngineError, ErrorCause, TokenDelta

T = TypeVar("T")

__all__ = [
    "DEFAULT_TIMEOUT",
    "PROBE_TIMEOUT",
    "AbortableStreams",
    "cause_of_status",
    "check_engine_prompt",
    "decode_json",
    "engine_error",
    "error_message",
    "message_of",
    "open_stream",
    "raise_for_status",
    "run_scoped",
    "sse_objects",
    "sse_payloads",
]

DEFAULT_TIMEOUT = httpx.Timeout(connect=2.0, read=120.0, write=10.0, pool=5.0)
"""Read covers a long prefill (and, when streaming, the gap between two chunks)."""
PROBE_TIMEOUT = httpx.Timeout(2.0)
"""/health and /metrics answer at once or the engine is in trouble."""

_RETRYABLE_4XX = frozenset({408, 425})


def cause_of_status(status: int) -> ErrorCause:
    """Whose fault an engine's error status is: 429 the engine's load, 5xx, 408 and 425 the
    instance's, any other the request's."""
    if status == 429:
        return "busy"
    return "instance" if status >= 500 or status in _RETRYABLE_4XX else "request"


def check_engine_prompt(instance_id: str, token_ids: list[int], vocab_size: int | None) -> None:
    """Refuse (not retryable) what no engine of this model accepts, before sending it.

    A vLLM started with ``--skip-tokenizer-init`` does not check token IDs and its
    engine process dies on one outside the vocabulary, so the check is done here.
    """
    if not token_ids:
        raise EngineError(instance_id, "empty prompt", cause="request")
    # min/max run in C; the scan that names the token runs only when one is out of range
    if vocab_size is not None and not (min(token_ids) >= 0 and max(token_ids) < vocab_size):
        bad = next((t for t in token_ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise EngineError(
                instance_id,
                f"token id {bad} out of vocabulary (vocab_size {vocab_size})",
                cause="request",
            )


def message_of(data: object) -> str | None:
    """The message of a parsed OpenAI-style error (``{"error": {...}}`` or flat), if any."""
    if not isinstance(data, dict):
        return None
    inner = data.get("error", data)
    if isinstance(inner, dict) and "message" in inner:
        return str(inner["message"])
    if isinstance(inner, str):
        return inner
    if "detail" in data:
        return str(data["detail"])
    return None


def error_message(body: str) -> str:
    """The message of an error body, or the body itself (truncated)."""
    try:
        message = message_of(json.loads(body))
    except ValueError:
        message = None
    return message if message is not None else body.strip()[:300]


def engine_error(instance_id: str, exc: httpx.HTTPError, what: str) -> EngineError:
    """An httpx transport error as an EngineError: a timeout is the instance's failure, a
    connection that could not be made or was cut means it is unreachable; the router's own
    connections all in use (a pool timeout) is back-pressure, never held against it."""
    if isinstance(exc, httpx.PoolTimeout):
        return EngineError(
            instance_id, f"{what}: the router's connections to engines are all in use: {exc}",
            cause="busy",
        )  # fmt: skip
    if isinstance(exc, httpx.TimeoutException):
        return EngineError(instance_id, f"{what}: engine timed out: {exc!r}")
    return EngineError(instance_id, f"{what}: engine unreachable: {exc!r}", cause="unreachable")


async def raise_for_status(instance_id: str, response: httpx.Response, what: str) -> None:
    """Raise EngineError for a non-2xx response (reading the body of a streamed one)."""
    if response.is_success:
        return
    body = (await response.aread())[:65536].decode("utf-8", "replace")
    status = response.status_code
    cause = cause_of_status(status)
    if cause != "request":
        raise EngineError(instance_id, f"{what}: HTTP {status}: {error_message(body)}", cause=cause)
    try:
        reason = message_of(json.loads(body))
    except ValueError:
        reason = None  # not an error in OpenAI's shape: nothing of it is shown to clients
    raise EngineError(
        instance_id,
        f"{what}: HTTP {status}: {error_message(body)}",
        cause="request",
        reason=reason if reason is not None else f"HTTP {status}",
    )


@contextlib.asynccontextmanager
async def open_stream(
    client: httpx.AsyncClient, method: str, url: str, **kwargs: Any
) -> AsyncIterator[httpx.Response]:
    """A streamed response whose connection is closed on the way out, even when the task is
    being cancelled (a client left): the engine sees the connection drop and aborts the
    request. httpx's own ``stream()`` closes it with an await that a cancelled task can skip,
    leaving the engine generating into a socket nobody reads."""
    response = await client.send(client.build_request(method, url, **kwargs), stream=True)
    try:
        yield response
    finally:
        await close_surely(response)


async def _outlive_cancels(work: asyncio.Future[T], on_cancel: Callable[[], object]) -> T:
    """``work``'s result, waited for even when the caller is cancelled meanwhile (each cancel
    calls ``on_cancel`` and the wait goes on); a cancelled caller then goes on being
    cancelled. ``work`` runs in a task of its own, so the caller's cancels never reach it."""
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(work)
            break
        except asyncio.CancelledError:
            if work.done():  # the work itself ended cancelled
                raise
            cancelled = True
            on_cancel()
    if cancelled:
        raise asyncio.CancelledError
    return result


async def close_surely(response: httpx.Response) -> None:
    """Close ``response`` even when its task is cancelled while it closes, then go on being
    cancelled. anyio's shield stops anyio's cancellation but not asyncio's ``Task.cancel``
    (a timeout's, an abort's, a consumer's that got the final token first), which landed in
    the close (at anyio's checkpoint as the socket closes) and left httpcore's pool holding
    the request for good: a steady leak of requests and connection objects."""
    await _outlive_cancels(asyncio.ensure_future(response.aclose()), lambda: None)


async def run_scoped(call: Callable[[], Awaitable[T]]) -> T:
    """``await call()`` in a task of its own that is only ever cancelled through an anyio
    cancel scope. httpcore shields its cleanup (returning a connection to the pool, closing
    a socket) with anyio, which holds off anyio's cancellation but not asyncio's
    ``Task.cancel``; a native cancel (a timeout, a caller cancelled) landing there leaves
    the pool holding the request, or a connection busy, for good. When the caller is
    cancelled, the call's scope is cancelled instead; the caller waits for the call to
    unwind (its cleanup shielded), then goes on being cancelled."""
    scope = anyio.CancelScope()

    async def scoped() -> T:
        with scope:
            return await call()
        raise asyncio.CancelledError  # the scope was cancelled before the call returned

    return await _outlive_cancels(asyncio.ensure_future(scoped()), scope.cancel)


async def sse_payloads(response: httpx.Response) -> AsyncGenerator[bytes, None]:
    """The payloads of an SSE stream's ``data:`` lines, as bytes (stripped, empty ones
    left out). Reads bytes and frames lines itself (``\n``, ``\r\n`` or ``\r``): a relayed
    token costs a fraction of what httpx's text lines do."""
    pending = b""
    encoded = "content-encoding" in response.headers  # else the bytes as they came
    async for chunk in response.aiter_bytes() if encoded else response.aiter_raw():
        lines = (pending + chunk).splitlines(keepends=True)
        pending = lines.pop() if lines and not lines[-1].endswith((b"\n", b"\r")) else b""
        for line in lines:
            if line.startswith(b"data:") and (data := line[5:].strip()):
                yield data
    if pending.startswith(b"data:") and (data := pending[5:].strip()):
        yield data


async def sse_objects(response: httpx.Response) -> AsyncIterator[dict[str, Any] | None]:
    """The JSON objects of ``data:`` lines of an SSE stream; None for ``[DONE]``."""
    async with contextlib.aclosing(sse_payloads(response)) as payloads:
        async for data in payloads:
            if data == b"[DONE]":
                yield None
                return
            try:
                obj = decode_json(data)
            except msgspec.DecodeError as exc:
                raise ValueError(f"malformed SSE data: {data[:120]!r}") from exc
            if not isinstance(obj, dict):
                raise ValueError(f"SSE data is not an object: {data[:120]!r}")
            yield obj


decode_json = msgspec.json.Decoder().decode
"""JSON bytes to Python objects (msgspec: several times json.loads' speed)."""


_Item = TokenDelta | Exception | None
Producer = Callable[[Callable[[TokenDelta], Awaitable[None]]], Awaitable[None]]


async def _stop(task: asyncio.Task[None], scope: anyio.CancelScope) -> None:
    """Cancel a producer through its scope and wait until it has closed its stream. Waiting
    never cancels it natively: a caller cancelled meanwhile stops waiting, and the producer
    finishes closing on its own."""
    scope.cancel()
    if not task.done():
        with anyio.CancelScope(shield=True), contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({task})


class _Channel:
    """What a stream's producer task hands its consumer: a deque and one waiter (lighter
    than an ``asyncio.Queue``, which a relayed token went through twice)."""

    __slots__ = ("_waiter", "items")

    def __init__(self) -> None:
        self.items: collections.deque[_Item] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: _Item) -> None:
        self.items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> _Item:
        while not self.items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.items.popleft()


def _merged(delta: TokenDelta, items: collections.deque[_Item]) -> TokenDelta:
    """``delta`` and the token deltas already waiting behind it as one delta, when the
    consumer has fallen behind the engine (as vLLM merges a slow consumer's outputs): each
    relayed event costs the same whatever its tokens, so a busy router catches up instead
    of falling further behind. A delta that finishes the stream ends the merge (it keeps
    its finish reason and cached tokens); an error or the end met on the way stays in
    ``items``, to be handled next. The merged delta reports the cached tokens any of them
    reported (vLLM's last, SGLang's first)."""
    if delta.finished or not items or not isinstance(items[0], TokenDelta):
        return delta
    ids = list(delta.token_ids)
    logprobs = None if delta.logprobs is None else list(delta.logprobs)
    cached = delta.cached_tokens
    while not delta.finished and items and isinstance(items[0], TokenDelta):
        following = items.popleft()
        assert isinstance(following, TokenDelta)
        ids.extend(following.token_ids)  # once each: a long backlog merges in linear time
        if logprobs is not None and following.logprobs is not None:
            logprobs.extend(following.logprobs)
        cached = cached if cached is not None else following.cached_tokens
        delta = following
    return TokenDelta(
        token_ids=ids, finished=delta.finished, finish_reason=delta.finish_reason,
        cached_tokens=cached, logprobs=logprobs,
    )  # fmt: skip


class AbortableStreams:
    """Runs each streamed generation in a task that ``abort(request_id)`` can cancel."""

    def __init__(self) -> None:
        self._tasks: dict[str, tuple[asyncio.Task[None], anyio.CancelScope]] = {}
        self._aborted: set[str] = set()

    async def run(self, request_id: str, producer: Producer) -> AsyncGenerator[TokenDelta, None]:
        """Yield what ``producer`` emits; after an abort, one final ``finish_reason="abort"``."""
        channel = _Channel()
        scope = anyio.CancelScope()

        async def emit(delta: TokenDelta) -> None:
            channel.put(delta)  # unbounded: the merge catches a slow consumer up

        async def work() -> None:
            # cancelled through its scope only (see run_scoped): the HTTP stream's close,
            # shielded by httpcore, then always completes
            with scope:
                try:
                    await producer(emit)
                except Exception as exc:
                    channel.put(exc)
                else:
                    channel.put(None)

        task = asyncio.create_task(work(), name=f"stream-{request_id}")
        self._tasks[request_id] = (task, scope)
        task.add_done_callback(lambda _: channel.put(None))
        try:
            while True:
                item = await channel.get()
                if isinstance(item, TokenDelta):
                    item = _merged(item, channel.items)
                if request_id in self._aborted:
                    yield TokenDelta(token_ids=[], finished=True, finish_reason="abort")
                    return
                if item is None:
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            self._aborted.discard(request_id)
            if self._tasks.get(request_id, (None,))[0] is task:
                del self._tasks[request_id]
            # wait for the producer to close its HTTP stream: a consumer being cancelled
            # (its client left) must not leave the connection open, or the engine goes on
            # generating into a socket nobody reads
            await _stop(task, scope)

    async def abort(self, request_id: str) -> None:
        """Cancel the request's stream (closing its HTTP response); unknown ids are ignored."""
        entry = self._tasks.get(request_id)
        if entry is None or entry[0].done():
            return
        self._aborted.add(request_id)
        await _stop(*entry)

    async def aclose(self) -> None:
        """Cancel every running stream."""
        for request_id in list(self._tasks):
            await self.abort(request_id)

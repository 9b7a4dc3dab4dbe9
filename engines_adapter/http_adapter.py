"""The base of the HTTP engine adapters: the state and the calls vLLM's and SGLang's share.

An adapter keeps its engine's own request bodies, responses and streams (``_stream``);
the base holds its endpoints and timeouts, runs a generation as an abortable stream,
answers ``GET /health``, reads load from ``GET /metrics``, subscribes to KV events over
ZMQ and closes what it opened.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypedDict

import httpx

from engines_adapter.contract import (
    EngineError,
    EngineLoad,
    GenerateRequest,
    KVEventBatch,
    TokenDelta,
)
from engines_adapter.engine_metrics import MetricNames, parse_load
from engines_adapter.http_engine import (
    DEFAULT_TIMEOUT,
    PROBE_TIMEOUT,
    AbortableStreams,
    engine_error,
    raise_for_status,
    run_scoped,
)
from engines_adapter.kv_subscriber import KVEventSubscriber

__all__ = ["Emit", "HttpEngineCommon", "HttpEngineOptions"]

Emit = Callable[[TokenDelta], Awaitable[None]]


class HttpEngineOptions(TypedDict, total=False):
    """The optional settings of ``HttpEngineCommon``, for adapters that pass them on."""

    kv_events_endpoint: str | None
    kv_replay_endpoint: str | None
    vocab_size: int | None
    timeout: httpx.Timeout
    probe_timeout: httpx.Timeout


class HttpEngineCommon(ABC):
    """What every HTTP engine adapter shares: endpoints, timeouts, the abortable streams of
    ``generate``, ``GET /health``, load from ``GET /metrics``, KV events over ZMQ, closing."""

    def __init__(
        self,
        instance_id: str,
        base_url: str,
        *,
        client: httpx.AsyncClient,
        kv_events_endpoint: str | None = None,
        kv_replay_endpoint: str | None = None,
        vocab_size: int | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        probe_timeout: httpx.Timeout = PROBE_TIMEOUT,
    ) -> None:
        self.instance_id = instance_id
        self.base_url = base_url.rstrip("/")
        self.kv_events_endpoint = kv_events_endpoint
        self.kv_replay_endpoint = kv_replay_endpoint
        self.vocab_size = vocab_size
        self._client = client
        self._timeout = timeout
        self._probe_timeout = probe_timeout
        self._streams = AbortableStreams()
        self._subscribers: set[KVEventSubscriber] = set()

    def _url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    @abstractmethod
    def _generate_body(self, request: GenerateRequest) -> dict[str, Any]:
        """The engine's streaming request for ``request`` (refusing a bad prompt)."""

    @abstractmethod
    async def _stream(self, request_id: str, body: dict[str, Any], emit: Emit) -> None:
        """Send ``body``, emit the engine's deltas, the last one finished."""

    def generate(self, request: GenerateRequest) -> AsyncGenerator[TokenDelta, None]:
        """Stream the request's tokens (``_stream``); ``abort`` ends the stream early. The
        stream itself is returned (a relayed token passes one generator less); a prompt
        the engine refuses is raised on its first step, as the stream's errors are."""

        async def produce(emit: Emit) -> None:
            await self._stream(request.request_id, self._generate_body(request), emit)

        return self._streams.run(request.request_id, produce)

    async def abort(self, request_id: str) -> None:
        """Close the request's stream; the engine aborts it. Unknown ids are ignored."""
        await self._streams.abort(request_id)

    async def health(self) -> bool:
        """``GET /health`` answers 200."""
        try:
            response = await run_scoped(
                lambda: self._client.get(self._url("/health"), timeout=self._probe_timeout)
            )
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def _metrics_load(self, names: MetricNames, *, missing: str | None = None) -> EngineLoad:
        """Load from ``GET /metrics`` under ``names``; ``missing`` says how to enable an
        endpoint that answers 404."""
        try:
            response = await run_scoped(
                lambda: self._client.get(self._url("/metrics"), timeout=self._probe_timeout)
            )
        except httpx.HTTPError as exc:
            raise engine_error(self.instance_id, exc, "load") from exc
        if missing is not None and response.status_code == 404:
            raise EngineError(self.instance_id, f"load: no /metrics ({missing})")
        await raise_for_status(self.instance_id, response, "load")
        try:
            return parse_load(response.text, names)
        except ValueError as exc:
            raise EngineError(self.instance_id, f"load: {exc}") from exc

    async def kv_events(self) -> AsyncGenerator[KVEventBatch, None]:
        """KV events from the engine's ZMQ publisher (``--kv-events-config``)."""
        if self.kv_events_endpoint is None:
            raise EngineError(self.instance_id, "no KV-event endpoint configured")
        subscriber = KVEventSubscriber(
            self.instance_id, self.kv_events_endpoint, replay_endpoint=self.kv_replay_endpoint
        )
        self._subscribers.add(subscriber)
        try:
            async for batch in subscriber.batches():
                yield batch
        finally:
            self._subscribers.discard(subscriber)
            subscriber.close()

    async def aclose(self) -> None:
        """Abort open streams and close KV-event sockets (the HTTP client belongs to the caller)."""
        await self._streams.aclose()
        for subscriber in list(self._subscribers):
            subscriber.close()

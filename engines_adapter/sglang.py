"""The SGLang adapter: the contract over SGLang's native ``/generate`` API with input IDs.

- generate: ``POST /generate`` with ``input_ids``, ``sampling_params``
  (``max_new_tokens``, ``temperature``, ``ignore_eos``), ``rid`` and ``stream``;
  SSE chunks carry ``output_ids`` (cumulative by default, only the new ones with
  ``--incremental-streaming-output``: both are handled) and ``meta_info``
  (``prompt_tokens``, ``completion_tokens``, ``cached_tokens``, ``finish_reason``
  as ``{"type": "length", ...}``).
- PD disaggregation: SGLang pairs a prefill and a decode server through a bootstrap
  room. The prefill request and the decode request carry the same
  ``bootstrap_host`` / ``bootstrap_port`` / ``bootstrap_room`` and run concurrently;
  the prefill finishes once the decode side has fetched the KV, and the decode
  stream starts with the first token. So on a prefill server (``bootstrap_port``
  set) ``prefill`` sends one request per decode target in the background and
  returns at once with ``first_token_id=None`` and one room per target in
  ``target_kv_params``; ``generate`` with such params joins the room.
  Without ``bootstrap_port`` ``prefill`` is a one-token generation, like vLLM's.
- load: ``GET /metrics`` (``--enable-metrics``: sglang:num_running_reqs,
  sglang:num_queue_reqs, sglang:token_usage, sglang:prompt_tokens_total,
  sglang:cached_tokens_total); health: ``GET /health``; KV events over ZMQ
  (``--kv-events-config``, the same wire format as vLLM's, events as arrays).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from typing import Any, Unpack
from urllib.parse import urlsplit

import httpx

from engines_adapter.contract import (
    EngineError,
    EngineLoad,
    Feature,
    GenerateRequest,
    PrefillResult,
    TokenDelta,
)
from engines_adapter.engine_metrics import SGLANG_METRICS
from engines_adapter.http_adapter import Emit, HttpEngineCommon, HttpEngineOptions
from engines_adapter.http_engine import (
    check_engine_prompt,
    engine_error,
    message_of,
    open_stream,
    raise_for_status,
    run_scoped,
    sse_objects,
)

__all__ = ["BOOTSTRAP_KEYS", "SGLangAdapter"]

log = logging.getLogger(__name__)

_EVENT_STREAM = {"Accept": "text/event-stream"}
"""Asked of a streamed generate: the router's client gives such streams connections of
their own (``engines_adapter/sse_transport.py``)."""

BOOTSTRAP_KEYS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")


def _finish_reason(meta: dict[str, Any]) -> str | None:
    reason = meta.get("finish_reason")
    if reason is None:
        return None
    if isinstance(reason, dict):
        return str(reason.get("type", "stop"))
    return str(reason)


def _new_tokens(output_ids: list[int], meta: dict[str, Any], seen: int) -> list[int]:
    """The tokens of a chunk not yet emitted, whether ``output_ids`` is cumulative or not."""
    completion = meta.get("completion_tokens")
    cumulative = isinstance(completion, int) and len(output_ids) == completion
    return output_ids[seen:] if cumulative else output_ids


class SGLangAdapter(HttpEngineCommon):
    """One SGLang server (``python -m sglang.launch_server``), optionally a PD prefill server.

    Log probabilities are not asked of it (its ``/generate`` reports them in a shape of its
    own not yet read here): a request for them is refused by the router."""

    features: frozenset[Feature] = frozenset({"structured_output"})

    def __init__(
        self,
        instance_id: str,
        base_url: str,
        *,
        client: httpx.AsyncClient,
        bootstrap_port: int | None = None,
        bootstrap_host: str | None = None,
        rng: random.Random | None = None,
        **options: Unpack[HttpEngineOptions],
    ) -> None:
        super().__init__(instance_id, base_url, client=client, **options)
        self.bootstrap_port = bootstrap_port
        self.bootstrap_host = bootstrap_host or urlsplit(self.base_url).hostname or "127.0.0.1"
        self._rng = rng or random.Random()
        self._prefills: dict[str, asyncio.Task[None]] = {}

    def _body(
        self, request: GenerateRequest, *, rid: str, max_new_tokens: int, stream: bool
    ) -> dict[str, Any]:
        check_engine_prompt(self.instance_id, request.prompt_token_ids, self.vocab_size)
        body: dict[str, Any] = {
            "input_ids": request.prompt_token_ids,
            "sampling_params": {
                **request.sampling,
                "max_new_tokens": max_new_tokens,
                "temperature": request.temperature,
                "ignore_eos": request.ignore_eos,
            },
            "rid": rid,
            "stream": stream,
        }
        if request.structured is not None:  # SGLang takes the schema as JSON text
            schema = request.structured.json_schema or {"type": "object"}
            body["sampling_params"]["json_schema"] = json.dumps(schema)
        params = request.kv_transfer_params or {}
        body.update({k: params[k] for k in BOOTSTRAP_KEYS if k in params})
        return body

    async def _post(self, body: dict[str, Any], what: str) -> dict[str, Any]:
        try:
            response = await run_scoped(
                lambda: self._client.post(self._url("/generate"), json=body, timeout=self._timeout)
            )
        except httpx.HTTPError as exc:
            raise engine_error(self.instance_id, exc, what) from exc
        await raise_for_status(self.instance_id, response, what)
        try:
            data = response.json()
        except ValueError as exc:
            raise EngineError(self.instance_id, f"{what}: the response is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise EngineError(self.instance_id, f"{what}: unexpected response {data!r:.100}")
        return data

    async def prefill(self, request: GenerateRequest, *, targets: int = 1) -> PrefillResult:
        """A one-token generation; on a PD prefill server, one bootstrap room per target."""
        if self.bootstrap_port is None:
            data = await self._post(
                self._body(request, rid=request.request_id, max_new_tokens=1, stream=False),
                "prefill",
            )
            output_ids = data.get("output_ids") or []
            meta = data.get("meta_info") or {}
            if not output_ids:
                raise EngineError(self.instance_id, "prefill: no output_ids in the response")
            cached = meta.get("cached_tokens")
            return PrefillResult(
                request_id=request.request_id,
                first_token_id=int(output_ids[0]),
                cached_tokens=cached if isinstance(cached, int) else None,
            )
        rooms = [self._rng.randrange(2**63) for _ in range(targets)]
        per_target = [
            {
                "bootstrap_host": self.bootstrap_host,
                "bootstrap_port": self.bootstrap_port,
                "bootstrap_room": room,
            }
            for room in rooms
        ]
        for i, params in enumerate(per_target):
            rid = f"{request.request_id}-p{i}"
            body = self._body(request, rid=rid, max_new_tokens=request.max_tokens, stream=False)
            body.update(params)
            task = asyncio.create_task(self._background_prefill(rid, body), name=f"prefill-{rid}")
            self._prefills[rid] = task
        return PrefillResult(
            request_id=request.request_id,
            first_token_id=None,
            kv_transfer_params=per_target[0],
            target_kv_params=per_target,
        )

    async def _background_prefill(self, rid: str, body: dict[str, Any]) -> None:
        """A PD prefill request; it completes once its decode side has taken the KV."""
        try:
            await self._post(body, "prefill")
        except EngineError as exc:
            log.warning("SGLang prefill %s failed: %s", rid, exc)
        finally:
            self._prefills.pop(rid, None)

    def _generate_body(self, request: GenerateRequest) -> dict[str, Any]:
        """A streamed ``/generate``; it joins a bootstrap room when the params carry one."""
        return self._body(
            request, rid=request.request_id, max_new_tokens=request.max_tokens, stream=True
        )

    async def _stream(self, request_id: str, body: dict[str, Any], emit: Emit) -> None:
        seen = 0
        cached: int | None = None
        finished = False
        try:
            async with open_stream(
                self._client, "POST", self._url("/generate"), json=body,
                timeout=self._timeout, headers=_EVENT_STREAM,
            ) as response:  # fmt: skip
                await raise_for_status(self.instance_id, response, "generate")
                async for chunk in sse_objects(response):
                    if chunk is None:
                        break
                    if "error" in chunk:
                        raise EngineError(
                            self.instance_id, f"generate: {message_of(chunk) or chunk!r:.300}"
                        )
                    meta = chunk.get("meta_info") or {}
                    tokens = _new_tokens(list(chunk.get("output_ids") or []), meta, seen)
                    seen += len(tokens)
                    reason = _finish_reason(meta)
                    first_report = cached is None and isinstance(meta.get("cached_tokens"), int)
                    if first_report:
                        cached = int(meta["cached_tokens"])
                    if tokens or reason is not None:
                        await emit(
                            TokenDelta(
                                token_ids=tokens,
                                finished=reason is not None,
                                finish_reason=reason,
                                cached_tokens=cached if first_report else None,
                            )
                        )
                    if reason is not None:
                        finished = True
                        break
        except httpx.HTTPError as exc:
            raise engine_error(self.instance_id, exc, "generate") from exc
        except ValueError as exc:
            raise EngineError(self.instance_id, f"generate: {exc}") from exc
        if not finished:
            raise EngineError(self.instance_id, "generate: stream ended without a finish_reason")

    async def abort(self, request_id: str) -> None:
        """Close the request's stream (SGLang aborts it); cancel its PD prefills."""
        await super().abort(request_id)
        for rid, task in list(self._prefills.items()):
            if rid.startswith(f"{request_id}-p"):
                task.cancel()

    async def load(self) -> EngineLoad:
        """Figures from ``/metrics`` (SGLang started with ``--enable-metrics``)."""
        return await self._metrics_load(
            SGLANG_METRICS, missing="start SGLang with --enable-metrics"
        )

    async def aclose(self) -> None:
        """Abort streams and PD prefills, close KV-event sockets (the client is the caller's)."""
        tasks = list(self._prefills.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await super().aclose()

"""The vLLM adapter: the contract over vLLM's OpenAI-compatible HTTP API, token IDs in and out.

- generate: ``POST /v1/completions`` with ``prompt`` as token IDs, ``stream``,
  ``return_token_ids`` and ``stream_options.include_usage``; the SSE chunks'
  ``choices[0].token_ids`` become TokenDelta, the cached prompt tokens come from
  the final usage chunk (``usage.prompt_tokens_details.cached_tokens``, which vLLM
  sends only when started with ``--enable-prompt-tokens-details``).
- prefill: the same request with ``max_tokens=1`` and ``kv_transfer_params:
  {"do_remote_decode": true, ...}`` as vLLM's P/D connectors expect; the response's
  ``kv_transfer_params`` are handed to the decode targets. Without a connector (CPU)
  vLLM ignores the field and the decode target recomputes from its prefix cache.
- load: ``GET /metrics``; health: ``GET /health``; KV events: ZMQ (kv_subscriber).
- logprobs: ``logprobs`` (the alternatives asked) with ``return_tokens_as_token_ids``, so
  every token comes back as its ID for the router to decode; structured output:
  ``response_format`` (``json_object``, or ``json_schema`` with the schema).
- abort: close the HTTP stream (vLLM aborts a request whose client went away).
"""

from __future__ import annotations

from typing import Any, Unpack

import httpx

from engines_adapter.contract import (
    EngineError,
    EngineLoad,
    Feature,
    GenerateRequest,
    PrefillResult,
    StructuredOutput,
    TokenDelta,
    TokenLogprob,
)
from engines_adapter.engine_metrics import VLLM_METRICS
from engines_adapter.http_adapter import Emit, HttpEngineCommon, HttpEngineOptions
from engines_adapter.http_engine import (
    cause_of_status,
    check_engine_prompt,
    engine_error,
    message_of,
    open_stream,
    raise_for_status,
    run_scoped,
    sse_objects,
)

__all__ = ["PREFILL_KV_PARAMS", "VLLMAdapter"]

PREFILL_KV_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
"""What vLLM's P/D proxies send a prefill instance (NixlConnector and friends)."""


def _usage_cached(chunk: dict[str, Any]) -> int | None:
    usage = chunk.get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        return int(details["cached_tokens"])
    return None


def response_format(structured: StructuredOutput) -> dict[str, Any]:
    """OpenAI's ``response_format``, which vLLM's completions take for structured output."""
    if structured.json_schema is None:
        return {"type": "json_object"}
    return {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": structured.json_schema},
    }


def _token_id(token: object) -> int:
    """A token as ``return_tokens_as_token_ids`` writes it (``token_id:123``)."""
    if isinstance(token, str) and token.startswith("token_id:"):
        return int(token[len("token_id:") :])
    raise ValueError(f"logprobs: {token!r} is not a token_id:N token")


def _logprobs(given: object, ids: list[int]) -> list[TokenLogprob] | None:
    """A completion chunk's ``logprobs`` (tokens, token_logprobs, top_logprobs) per token."""
    if not isinstance(given, dict):
        return None
    values = given.get("token_logprobs") or []
    tops = given.get("top_logprobs") or [None] * len(values)
    if len(values) != len(ids) or len(tops) != len(ids):
        raise ValueError(f"logprobs for {len(values)} tokens in a chunk of {len(ids)}")
    out = []
    for token, value, top in zip(ids, values, tops, strict=True):
        alternatives = sorted(((_token_id(t), float(v)) for t, v in (top or {}).items()),
                              key=lambda a: -a[1])  # fmt: skip
        logprob = float(value) if value is not None else float("-inf")
        out.append(TokenLogprob(token_id=token, logprob=logprob, top=alternatives))
    return out


class VLLMAdapter(HttpEngineCommon):
    """One vLLM server (``vllm serve`` / ``vllm.entrypoints.openai.api_server``)."""

    features: frozenset[Feature] = frozenset({"logprobs", "structured_output"})

    def __init__(
        self,
        instance_id: str,
        base_url: str,
        *,
        client: httpx.AsyncClient,
        model: str | None = None,
        **options: Unpack[HttpEngineOptions],
    ) -> None:
        super().__init__(instance_id, base_url, client=client, **options)
        self.model = model

    def _body(self, request: GenerateRequest, *, max_tokens: int, stream: bool) -> dict[str, Any]:
        check_engine_prompt(self.instance_id, request.prompt_token_ids, self.vocab_size)
        body: dict[str, Any] = {
            **request.sampling,
            "prompt": request.prompt_token_ids,
            "max_tokens": max_tokens,
            "temperature": request.temperature,
            "ignore_eos": request.ignore_eos,
            "return_token_ids": True,
            "stream": stream,
            "request_id": request.request_id,
        }
        if self.model is not None:
            body["model"] = self.model
        if request.logprobs is not None:  # alternatives as token IDs, decoded by the router
            body["logprobs"] = request.logprobs
            body["return_tokens_as_token_ids"] = True
        if request.structured is not None:
            body["response_format"] = response_format(request.structured)
        if stream:
            body["stream_options"] = {"include_usage": True}
        if request.kv_transfer_params is not None:
            body["kv_transfer_params"] = request.kv_transfer_params
        return body

    async def prefill(self, request: GenerateRequest, *, targets: int = 1) -> PrefillResult:
        """One-token completion that leaves the prompt's KV for ``targets`` decode instances."""
        body = self._body(request, max_tokens=1, stream=False)
        body["kv_transfer_params"] = {**PREFILL_KV_PARAMS, **(request.kv_transfer_params or {})}
        headers = {"X-Request-Id": request.request_id}
        try:
            response = await run_scoped(
                lambda: self._client.post(
                    self._url("/v1/completions"), json=body, headers=headers, timeout=self._timeout
                )
            )
        except httpx.HTTPError as exc:
            raise engine_error(self.instance_id, exc, "prefill") from exc
        await raise_for_status(self.instance_id, response, "prefill")
        try:
            data = response.json()
            token_ids = data["choices"][0]["token_ids"]
            first = int(token_ids[0])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise EngineError(
                self.instance_id,
                f"prefill: no choices[0].token_ids in the response (return_token_ids): {exc!r}",
            ) from exc
        params = data.get("kv_transfer_params")
        return PrefillResult(
            request_id=request.request_id,
            first_token_id=first,
            cached_tokens=_usage_cached(data),
            kv_transfer_params=params if isinstance(params, dict) else None,
        )

    def _generate_body(self, request: GenerateRequest) -> dict[str, Any]:
        """The streaming completion; its final delta carries cached_tokens."""
        return self._body(request, max_tokens=request.max_tokens, stream=True)

    async def _stream(
        self,
        request_id: str,
        body: dict[str, Any],
        emit: Emit,
    ) -> None:
        final: TokenDelta | None = None
        cached: int | None = None
        headers = {"X-Request-Id": request_id, "Accept": "text/event-stream"}
        try:
            async with open_stream(
                self._client, "POST", self._url("/v1/completions"), json=body, headers=headers,
                timeout=self._timeout,
            ) as response:  # fmt: skip
                await raise_for_status(self.instance_id, response, "generate")
                async for chunk in sse_objects(response):
                    if chunk is None:
                        break
                    if "error" in chunk:
                        raise EngineError(
                            self.instance_id,
                            f"generate: {message_of(chunk) or chunk!r:.300}",
                            cause=cause_of_status(_error_code(chunk)),
                            reason=message_of(chunk),
                        )
                    if cached is None and "usage" in chunk:
                        cached = _usage_cached(chunk)
                    for choice in chunk.get("choices") or []:
                        ids = list(choice.get("token_ids") or [])
                        reason = choice.get("finish_reason")
                        delta = TokenDelta(
                            token_ids=ids,
                            finished=reason is not None,
                            finish_reason=reason,
                            logprobs=_logprobs(choice.get("logprobs"), ids),
                        )
                        if delta.finished:
                            final = delta  # held until the usage chunk that follows it
                        elif delta.token_ids:
                            await emit(delta)
        except httpx.HTTPError as exc:
            raise engine_error(self.instance_id, exc, "generate") from exc
        except ValueError as exc:
            raise EngineError(self.instance_id, f"generate: {exc}") from exc
        if final is None:
            raise EngineError(self.instance_id, "generate: stream ended without a finish_reason")
        if "kv_transfer_params" in body:
            # KV received over a connector counts in vLLM's cached tokens (its computed
            # tokens include the external ones): not what this engine's prefix cache held
            cached = None
        await emit(final.model_copy(update={"cached_tokens": cached}))

    async def load(self) -> EngineLoad:
        """Figures from ``/metrics`` (vllm:num_requests_running, ...)."""
        return await self._metrics_load(VLLM_METRICS)


def _error_code(chunk: dict[str, Any]) -> int:
    error = chunk.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, int) else 500

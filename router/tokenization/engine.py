"""A tokenizer that asks the engine (vLLM's ``POST /tokenize``), with an LRU of answers."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from engines_adapter.http_engine import run_scoped
from router.tokenization.chat_template import Message
from router.tokenization.protocol import Tools, TooManyTokens

__all__ = ["EngineTokenizeError", "EngineTokenizer"]


LARGE_ANSWER_BYTES = 1 << 20
"""An engine's answer larger than this is parsed in a worker thread."""


class EngineTokenizeError(RuntimeError):
    """The engine did not tokenize: unreachable, an error status, or an odd answer."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class EngineTokenizer:
    """The AsyncTokenizerLike protocol over an engine's HTTP API, for a model whose
    tokenizer files the router does not have.

    vLLM: ``POST {url}/tokenize`` with ``{"model", "prompt", "add_special_tokens"}`` or
    ``{"model", "messages", "add_generation_prompt", "add_special_tokens": false,
    "tools", "chat_template_kwargs", ...}`` answers ``{"count", "max_model_len",
    "tokens"}``; ``POST {url}/detokenize`` with ``{"model", "tokens"}`` answers
    ``{"prompt"}``. Answers are cached (LRU by a digest of the request body), and
    concurrent identical requests share one call.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        url: str,
        *,
        model: str | None = None,
        cache_entries: int = 1024,
        timeout_s: float = 30.0,
        max_tokens: int | None = None,
    ) -> None:
        self.client = client
        self.max_tokens = max_tokens  # a longer answer is refused (TooManyTokens), not kept
        self.url = url.rstrip("/")
        self.model = model
        self.cache_entries = cache_entries
        self.timeout_s = timeout_s
        self.max_model_len: int | None = None  # from the last answer
        self.calls = 0  # requests sent to the engine
        self.hits = 0  # answers served from the cache
        self._cache: OrderedDict[bytes, list[int]] = OrderedDict()
        self._inflight: dict[bytes, asyncio.Future[list[int]]] = {}

    async def encode_text(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return await self._tokenize({"prompt": text, "add_special_tokens": add_special_tokens})

    async def encode_chat(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Tools | None = None,
        **template_kwargs: Any,
    ) -> list[int]:
        """Top-level fields of vLLM's chat tokenize request (``continue_final_message``,
        ``chat_template``, ``add_special_tokens``) are sent as such; other keyword
        arguments go to the template as ``chat_template_kwargs``."""
        body: dict[str, Any] = {
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
            "add_special_tokens": bool(template_kwargs.pop("add_special_tokens", False)),
        }
        for key in ("continue_final_message", "chat_template"):
            if key in template_kwargs:
                body[key] = template_kwargs.pop(key)
        if tools is not None:
            body["tools"] = [dict(t) for t in tools]
        if template_kwargs:
            body["chat_template_kwargs"] = template_kwargs
        return await self._tokenize(body)

    async def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """vLLM's ``/detokenize`` (it keeps special tokens whatever is asked)."""
        answer = await self._post("/detokenize", self._with_model({"tokens": list(ids)}))
        prompt = answer.get("prompt")
        if not isinstance(prompt, str):
            raise EngineTokenizeError("detokenize answer without a prompt string")
        return prompt

    def _with_model(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"model": self.model, **body} if self.model is not None else body

    async def _tokenize(self, body: dict[str, Any]) -> list[int]:
        body = self._with_model(body)
        key = hashlib.blake2b(
            json.dumps(body, sort_keys=True, ensure_ascii=False, default=str).encode(),
            digest_size=16,
        ).digest()
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            self.hits += 1
            return list(cached)
        pending = self._inflight.get(key)
        if pending is not None:
            self.hits += 1
            return list(await asyncio.shield(pending))
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            tokens = _tokens_of(await self._post("/tokenize", body), self.max_tokens)
            future.set_result(tokens)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # marked retrieved: the waiters, if any, get it
            raise
        finally:
            del self._inflight[key]
        self._cache[key] = tokens
        while len(self._cache) > self.cache_entries:
            self._cache.popitem(last=False)
        return list(tokens)

    async def _post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.calls += 1
        try:
            response = await run_scoped(  # cancelled, it still leaves httpx's pool
                lambda: self.client.post(self.url + path, json=body, timeout=self.timeout_s)
            )
        except httpx.HTTPError as exc:
            raise EngineTokenizeError(f"{self.url}{path}: {exc!r}") from exc
        if response.status_code != 200:
            raise EngineTokenizeError(
                f"{self.url}{path} answered {response.status_code}: {response.text[:200]}",
                status=response.status_code,
            )
        try:  # a million token IDs take tens of milliseconds to parse: off the loop
            content = response.content
            answer = (
                await asyncio.to_thread(json.loads, content)
                if len(content) > LARGE_ANSWER_BYTES
                else json.loads(content)
            )
        except ValueError as exc:
            raise EngineTokenizeError(f"{self.url}{path} answered no JSON") from exc
        if not isinstance(answer, dict):
            raise EngineTokenizeError(f"{self.url}{path} answered {type(answer).__name__}")
        max_len = answer.get("max_model_len")
        if isinstance(max_len, int):
            self.max_model_len = max_len
        return answer


def _tokens_of(answer: Mapping[str, Any], limit: int | None = None) -> list[int]:
    """The answer's token IDs, checked; ``TooManyTokens`` past ``limit`` (counted first)."""
    tokens = answer.get("tokens")
    if limit is not None and isinstance(tokens, list) and len(tokens) > limit:
        raise TooManyTokens(len(tokens), limit)
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens
    ):
        raise EngineTokenizeError("tokenize answer without a list of token IDs")
    count = answer.get("count")
    if isinstance(count, int) and count != len(tokens):
        raise EngineTokenizeError(f"tokenize answer counts {count} tokens, lists {len(tokens)}")
    return tokens

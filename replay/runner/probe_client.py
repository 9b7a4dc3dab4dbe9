"""The requests of a calibration (``calibrate``) to an OpenAI-compatible endpoint: fresh
token IDs for every prompt, each request timed by the engine's own clock (its prefill and
decode time histograms at ``/metrics``, ``engine_clock``) or by its round trip."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import numpy as np

from replay.runner.engine_clock import DECODE, PREFILL, read_totals, settled_totals
from router.errors import UserError

__all__ = ["ProbeClient", "refused", "round_trip_s"]


class ProbeClient:
    """Requests to the endpoint at ``url``, with fresh token IDs for every prompt, timed by
    the engine's clock (``engine_clock``) or by their round trips."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        url: str,
        model: str | None,
        vocab_size: int,
        seed: int | None,
        engine_clock: bool,
    ) -> None:
        self.client = client
        self.url = url
        self.model = model
        self.vocab_size = vocab_size
        self.engine_clock = engine_clock
        self.outside_s: list[float] = []  # round trip less the engine's prefill time
        # fresh IDs by default: a second calibration of the same engine with the same
        # prompts would find them cached and time nothing
        self._rng = np.random.default_rng(seed)

    def tokens(self, n: int) -> list[int]:
        ids: list[int] = self._rng.integers(10, self.vocab_size, n).tolist()
        return ids

    def _body(self, prompt: list[int], max_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                "ignore_eos": True, "stream": self.engine_clock}  # fmt: skip
        if self.engine_clock:
            body["stream_options"] = {"include_usage": True}
        if self.model is not None:
            body["model"] = self.model
        return body

    async def _post(self, prompt: list[int], max_tokens: int) -> tuple[float, dict[str, Any]]:
        """Seconds to the whole answer and the answer's usage. Timed by the engine's clock,
        the answer is streamed, as clients ask for it, so the engine does the work of
        every streamed token while it is measured (on a CPU engine this slows its steps
        measurably); timed by the client's, it is not (a client slow to read chunks
        would add its own delays)."""
        url = f"{self.url}/v1/completions"
        body = self._body(prompt, max_tokens)
        start = time.perf_counter()
        if not self.engine_clock:
            response = await self.client.post(url, json=body)
            if response.status_code != 200:
                raise refused(url, response.status_code, response.text)
            answered = response.json().get("usage") or {}
            return time.perf_counter() - start, answered if isinstance(answered, dict) else {}
        usage: dict[str, Any] | None = None
        async with self.client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                raise refused(url, response.status_code, text)
            async for line in response.aiter_lines():
                event = line.removeprefix("data:").strip()
                if not line.startswith("data:") or not event.startswith("{"):
                    continue
                chunk = json.loads(event)
                if not isinstance(chunk, dict):
                    continue
                if "error" in chunk:
                    raise UserError(
                        f"{url} ended a calibration request with an error: {event[:200]}"
                    )
                if isinstance(chunk.get("usage"), dict):
                    usage = chunk["usage"]
        if usage is None:
            raise UserError(
                f"{url} streamed an answer without its usage (stream_options.include_usage), "
                "which calibration by the engine's clock reads; use --clock client"
            )
        return time.perf_counter() - start, usage

    async def complete(self, prompt: list[int]) -> tuple[float, int | None]:
        """One prefill (max_tokens 1): its seconds, and the cached tokens the engine
        reported (None: not reported)."""
        before = await read_totals(self.client, self.url) if self.engine_clock else None
        seconds, usage = await self._post(prompt, 1)
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
        if before is not None:
            after = await settled_totals(self.client, self.url, before, 1)
            engine_s = after.mean_since(before, PREFILL)
            self.outside_s.append(seconds - engine_s)
            seconds = engine_s
        return seconds, cached if isinstance(cached, int) else None

    async def decode_s(self, batch: int, prompt: int, tokens: int) -> float:
        """``batch`` requests of ``prompt``-token prompts at once, each generating
        ``tokens``: by the engine's clock, their mean time from first to last token; by
        the client's, the median of their round trips."""
        before = await read_totals(self.client, self.url) if self.engine_clock else None
        runs = await asyncio.gather(
            *(self._generate_s(self.tokens(prompt), tokens) for _ in range(batch))
        )
        if before is None:
            return float(np.median(runs))
        after = await settled_totals(self.client, self.url, before, batch)
        return after.mean_since(before, DECODE)

    async def _generate_s(self, prompt: list[int], tokens: int) -> float:
        seconds, usage = await self._post(prompt, tokens)
        made = usage.get("completion_tokens")
        if isinstance(made, int) and made != tokens:
            raise UserError(
                f"{self.url}/v1/completions generated {made} tokens where {tokens} "
                "were asked with ignore_eos: calibration needs an engine that honours ignore_eos"
            )
        return seconds


def refused(url: str, status: int, text: str) -> UserError:
    return UserError(f"{url} answered {status} to a calibration request: {text[:200]}")


async def round_trip_s(client: httpx.AsyncClient, url: str) -> float:
    """Median of five round trips of ``GET /v1/models``, the engine's lightest answer."""
    times = []
    for _ in range(5):
        start = time.perf_counter()
        response = await client.get(f"{url}/v1/models")
        times.append(time.perf_counter() - start)
        if response.status_code != 200:
            raise refused(f"{url}/v1/models", response.status_code, response.text)
    return float(np.median(times))

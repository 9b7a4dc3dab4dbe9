"""The router's own time per request, measured on a running pdd-router (``timing.router_s``).

A router reports, per request, its time to first token less its waits on the engines (the
prefill call, the first token of the decode stream): ``pdd_router_overhead_seconds``. Sent
requests one at a time, as the engines' costs are measured, its mean over them is the
router's own time with nothing else in its way, which the replay charges each request in
turn (a burst waits in line).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from replay.runner.endpoint import check_answers
from router.errors import UserError

__all__ = ["OVERHEAD_METRIC", "RouterTime", "check_router", "measure_router_s"]

OVERHEAD_METRIC = "pdd_router_overhead_seconds"


@dataclass(frozen=True, slots=True)
class RouterTime:
    router_s: float  # the mean own time per request
    requests: int  # how many it is the mean of


async def _totals(client: httpx.AsyncClient, url: str) -> tuple[float, float]:
    """(sum, count) of the router's own time so far."""
    try:
        answer = await client.get(f"{url}/metrics", timeout=10)
        answer.raise_for_status()
    except httpx.HTTPError as exc:
        raise UserError(f"{url}/metrics did not answer: {exc}") from None
    try:
        found = {
            sample.name: sample.value
            for family in text_string_to_metric_families(answer.text)
            if family.name == OVERHEAD_METRIC
            for sample in family.samples
        }
    except ValueError:
        raise UserError(f"{url}/metrics is not Prometheus text: is it a pdd-router?") from None
    if f"{OVERHEAD_METRIC}_count" not in found or f"{OVERHEAD_METRIC}_sum" not in found:
        raise UserError(f"{url}/metrics has no {OVERHEAD_METRIC}: is it a pdd-router?")
    return found[f"{OVERHEAD_METRIC}_sum"], found[f"{OVERHEAD_METRIC}_count"]


async def _measure(
    url: str, model: str | None, headers: dict[str, str], vocab_size: int, max_prompt: int,
    requests: int,
) -> RouterTime:  # fmt: skip
    rng = random.Random(0x5EED)
    async with httpx.AsyncClient(headers=headers, timeout=60) as client:
        await check_answers(client, url)
        before = await _totals(client, url)
        for i in range(requests):
            length = min(64 << (i % 6), max(max_prompt // 2, 64))
            body = {"prompt": [rng.randrange(1, vocab_size) for _ in range(length)],
                    "max_tokens": 8, "stream": True, "ignore_eos": True}  # fmt: skip
            if model is not None:
                body["model"] = model
            try:
                async with client.stream("POST", f"{url}/v1/completions", json=body) as answer:
                    if answer.status_code != 200:
                        text = (await answer.aread()).decode(errors="replace")[:200]
                        raise UserError(
                            f"{url} refused a request: HTTP {answer.status_code} {text}"
                        )
                    async for _ in answer.aiter_lines():
                        pass
            except httpx.HTTPError as exc:
                raise UserError(f"{url} failed a request: {exc}") from None
        after = await _totals(client, url)
    counted = after[1] - before[1]
    if counted <= 0:
        raise UserError(f"{url} counted none of the {requests} requests in {OVERHEAD_METRIC}")
    return RouterTime((after[0] - before[0]) / counted, int(counted))


def check_router(url: str, *, api_key: str | None = None) -> None:
    """Refuse at once (UserError) an endpoint that is not a pdd-router reporting its own
    time, before minutes of other work."""

    async def check() -> None:
        async with httpx.AsyncClient(headers=_headers(api_key), timeout=10) as client:
            await _totals(client, url.rstrip("/"))

    asyncio.run(check())


def _headers(api_key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


def measure_router_s(
    url: str, *, model: str | None = None, api_key: str | None = None, vocab_size: int,
    max_prompt: int, requests: int = 12,
) -> RouterTime:  # fmt: skip
    """Send ``requests`` completions through the router at ``url`` one at a time (prompts
    of random tokens, 64 up to half ``max_prompt`` long, 8 output tokens, streamed) and
    return the mean of its own time per request over them."""
    return asyncio.run(
        _measure(url.rstrip("/"), model, _headers(api_key), vocab_size, max_prompt, requests)
    )

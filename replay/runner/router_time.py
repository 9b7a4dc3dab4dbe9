"""The router's time per request, measured on a running pdd-router (``timing.router_s``).

A router reports, per request, its time to first token (``pdd_router_ttft_seconds``) and
that time less its waits on the engines (the prefill call, the first token of the decode
stream): its own time, ``pdd_router_overhead_seconds``. Its time to first token starts
when its handler takes the request and ends when it hands the first token on, so a client
sees more: the request's way in (the connection, the body read and parsed) and the first
token's way out (the response's headers and first event, the client's read). Sent requests
one at a time, as the engines' costs are measured, the router's time is its own time plus
that difference (the client's time to first token less the router's), in the mean over
them: what a request spends in and around the router with nothing else in its way, which
the replay charges each request in turn (a burst waits in line).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from engines_adapter.http_engine import sse_payloads
from replay.runner.endpoint import check_answers
from router.errors import UserError

__all__ = ["OVERHEAD_METRIC", "TTFT_METRIC", "RouterTime", "check_router", "measure_router_s"]

OVERHEAD_METRIC = "pdd_router_overhead_seconds"
TTFT_METRIC = "pdd_router_ttft_seconds"


@dataclass(frozen=True, slots=True)
class RouterTime:
    own_s: float  # the mean of the router's own time (pdd_router_overhead_seconds)
    path_s: float  # the mean of the client's time to first token less the router's
    requests: int  # how many they are the means of

    @property
    def router_s(self) -> float:
        """What the replay charges a request: the router's own time and the way to and
        from it."""
        return self.own_s + self.path_s


async def _totals(client: httpx.AsyncClient, url: str) -> tuple[float, float, float, float]:
    """(sum, count) of the router's own time so far, then (sum, count) of its time to
    first token."""
    try:
        answer = await client.get(f"{url}/metrics", timeout=10)
        answer.raise_for_status()
    except httpx.HTTPError as exc:
        raise UserError(f"{url}/metrics did not answer: {exc}") from None
    found: dict[str, float] = {}
    families: set[str] = set()
    try:
        for family in text_string_to_metric_families(answer.text):
            if family.name in (OVERHEAD_METRIC, TTFT_METRIC):
                families.add(family.name)
                for sample in family.samples:  # summed over labels (the time to first
                    if sample.name.endswith(("_sum", "_count")):  # token's, per arm)
                        found[sample.name] = found.get(sample.name, 0.0) + sample.value
    except ValueError:
        raise UserError(f"{url}/metrics is not Prometheus text: is it a pdd-router?") from None
    for metric in (OVERHEAD_METRIC, TTFT_METRIC):
        if metric not in families:
            raise UserError(f"{url}/metrics has no {metric}: is it a pdd-router?")

    def total(name: str) -> float:
        return found.get(name, 0.0)  # a labelled histogram shows nothing before a request

    return (total(f"{OVERHEAD_METRIC}_sum"), total(f"{OVERHEAD_METRIC}_count"),
            total(f"{TTFT_METRIC}_sum"), total(f"{TTFT_METRIC}_count"))  # fmt: skip


async def _measure(
    url: str, model: str | None, headers: dict[str, str], vocab_size: int, max_prompt: int,
    requests: int,
) -> RouterTime:  # fmt: skip
    rng = random.Random(0x5EED)
    async with httpx.AsyncClient(headers=headers, timeout=60) as client:
        await check_answers(client, url)
        before = await _totals(client, url)
        firsts = []  # the client's time to first token of each request
        for i in range(requests):
            length = min(64 << (i % 6), max(max_prompt // 2, 64))
            body = {"prompt": [rng.randrange(1, vocab_size) for _ in range(length)],
                    "max_tokens": 8, "stream": True, "ignore_eos": True}  # fmt: skip
            if model is not None:
                body["model"] = model
            sent, first = time.perf_counter(), None
            try:
                async with client.stream("POST", f"{url}/v1/completions", json=body) as answer:
                    if answer.status_code != 200:
                        text = (await answer.aread()).decode(errors="replace")[:200]
                        raise UserError(
                            f"{url} refused a request: HTTP {answer.status_code} {text}"
                        )
                    async for data in sse_payloads(answer):
                        if first is None and data != b"[DONE]":
                            first = time.perf_counter() - sent
            except httpx.HTTPError as exc:
                raise UserError(f"{url} failed a request: {exc}") from None
            if first is None:
                raise UserError(f"{url} streamed no event for a request")
            firsts.append(first)
        after = await _totals(client, url)
    counted, timed = after[1] - before[1], after[3] - before[3]
    if counted != requests or timed != requests:
        raise UserError(
            f"{url} counted {counted:g} requests in {OVERHEAD_METRIC} and {timed:g} in "
            f"{TTFT_METRIC} while {requests} were sent: other traffic, or several replicas "
            "behind this URL? Measure one router with nothing else sending to it"
        )
    own = (after[0] - before[0]) / counted
    path = sum(firsts) / len(firsts) - (after[2] - before[2]) / timed
    return RouterTime(own, max(path, 0.0), int(counted))


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
    return the means of its own time and of the way to and from it over them."""
    return asyncio.run(
        _measure(url.rstrip("/"), model, _headers(api_key), vocab_size, max_prompt, requests)
    )

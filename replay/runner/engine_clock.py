"""An engine's own timing of its requests: vLLM's latency histograms at ``GET /metrics``.

vLLM times each request with its engine core's clock: ``request_prefill_time`` from the
step that scheduled it to its first token, ``request_decode_time`` from its first token
to its last. A histogram's ``_sum`` and ``_count`` read before and after a probe give
the probe's requests' total and number, so a calibration can time the engine's passes
without the HTTP round trip and without the client's own delays (a busy client reads a
burst of tokens late and would take the engine for slower than it is).

Engines that export no such histograms (SGLang names them otherwise) are timed by the
client instead: ``read_totals`` returns None for them. The engine simulator exports both,
timed as vLLM times them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx

from engines_adapter.engine_metrics import parse_samples
from router.errors import UserError

__all__ = ["DECODE", "PREFILL", "EngineTotals", "read_totals", "settled_totals"]

PREFILL = "vllm:request_prefill_time_seconds"
"""From the engine step that scheduled a request to its first token."""
DECODE = "vllm:request_decode_time_seconds"
"""From a request's first token to its last."""


@dataclass(frozen=True, slots=True)
class EngineTotals:
    """Each histogram's sum (seconds) and count (requests) so far, over label sets."""

    sums: dict[str, float]
    counts: dict[str, float]

    def mean_since(self, before: EngineTotals, name: str) -> float:
        """Mean seconds per request of ``name`` over the requests counted since ``before``."""
        count = self.counts[name] - before.counts[name]
        if count <= 0:
            raise ValueError(f"no request counted in {name} since the reading before")
        return (self.sums[name] - before.sums[name]) / count

    def counted_since(self, before: EngineTotals, name: str) -> int:
        return round(self.counts[name] - before.counts[name])


async def read_totals(client: httpx.AsyncClient, url: str) -> EngineTotals | None:
    """The engine's prefill and decode histograms now; None when it does not export both
    (no /metrics, or other metric names)."""
    try:
        response = await client.get(f"{url}/metrics", timeout=10)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        values, _ = parse_samples(response.text)
    except ValueError:
        return None
    sums, counts = {}, {}
    for name in (PREFILL, DECODE):
        if f"{name}_sum" not in values or f"{name}_count" not in values:
            return None
        sums[name] = sum(values[f"{name}_sum"])
        counts[name] = sum(values[f"{name}_count"])
    return EngineTotals(sums, counts)


async def settled_totals(
    client: httpx.AsyncClient, url: str, before: EngineTotals, requests: int, wait_s: float = 5.0
) -> EngineTotals:
    """The totals once ``requests`` more have been counted in both histograms since
    ``before``: vLLM records a request's figures just after answering it, so a reading
    right after the answer can miss the last ones. Waits at most ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        now = await read_totals(client, url)
        if now is None:
            raise UserError(f"{url}/metrics stopped exporting the latency histograms")
        if all(now.counted_since(before, name) >= requests for name in (PREFILL, DECODE)):
            return now
        if time.monotonic() > deadline:
            counted = now.counted_since(before, PREFILL)
            raise UserError(
                f"{url}/metrics counted {counted} of {requests} requests after {wait_s:.0f} s"
            )
        await asyncio.sleep(0.05)

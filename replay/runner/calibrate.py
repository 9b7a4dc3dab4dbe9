"""Calibrate the simulator on a running engine: measure pass times, fit ``FittedTiming``.

A designed set of requests goes to an OpenAI-compatible endpoint (vLLM, SGLang, the
engine simulator), one kind at a time so each measurement isolates one cost:

* prefill: a prompt of N new tokens after C cached ones (the prefix sent once before,
  so the engine's prefix cache holds it), ``max_tokens`` 1, over a grid of N and C;
  cached tokens are read from ``usage.prompt_tokens_details`` when the engine reports
  them;
* decode: B requests at once of short prompts (and B of the longest that the engine's
  KV memory holds at that B, ``decode_shapes``), generating N/4 tokens with
  ``ignore_eos``, then B generating N: the difference of the two decode times over the
  3N/4 tokens between is the step (the prefills and the first steps, while the batch's
  prompts are still being prefilled, cancel); a probe whose difference is not positive
  is left out with a warning.

Whose clock times them (``clock``): the engine's own when it exports its per-request
prefill and decode times (vLLM's histograms at ``/metrics``, ``engine_clock``), so
neither the HTTP round trip nor a busy client's delays are taken for engine work; the
probes are then streamed, as clients ask, so the server's per-token work is in the decode
cost. The client's clock otherwise (the round trip of each answer, not streamed, the
quicker of two tries per decode measurement, since a stall only ever adds time). With the
engine's clock, the median round trip less the engine's prefill time and less a round trip
of ``GET /v1/models`` (the network's share) is the server's own time per request
(``FittedTiming.frontend_s``).

The requests themselves are ``probe_client``'s; the fit is ``calibration_fit``.

Least squares with non-negative coefficients then fits a prefill pass as ``overhead +
per_token * N + per_token_pair * (N*C + N*N/2)`` and a decode step as ``overhead +
per_request * B + per_context_token * (context tokens of the batch)``. The fit's
error on its own measurements is reported; the result is a ``FittedTiming`` for the
pools of a preset whose engines are like the one measured.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import numpy as np

from engines_adapter.engine_metrics import parse_load
from replay.presets.schema import FittedTiming
from replay.runner.calibration_fit import DecodeProbe, PrefillProbe, fit_decode, fit_prefill
from replay.runner.endpoint import check_answers
from replay.runner.engine_clock import read_totals
from replay.runner.probe_client import ProbeClient, round_trip_s
from router.errors import UserError

__all__ = [
    "SHORT_PROMPT",
    "CalibrationOptions",
    "CalibrationResult",
    "Clock",
    "calibrate",
    "decode_shapes",
    "fitting_prompt",
    "probe_count",
]


Clock = Literal["auto", "engine", "client"]

SHORT_PROMPT = 64  # tokens of the short decode probes' prompts


@dataclass(frozen=True, slots=True)
class CalibrationOptions:
    url: str
    model: str | None = None
    api_key: str | None = None
    vocab_size: int = 32_000
    new_tokens: tuple[int, ...] = (64, 256, 512, 1024, 2048)
    cached_tokens: tuple[int, ...] = (0, 1024)
    batches: tuple[int, ...] = (1, 2, 4, 8)
    decode_tokens: int = 64  # generated per decode request (and a quarter as many)
    short_prompt: int = SHORT_PROMPT
    long_prompt: int = 1024
    repeats: int = 3
    seed: int | None = None  # of the prompts' token IDs; None: fresh ones each calibration
    timeout_s: float = 300.0
    clock: Clock = "auto"  # auto: the engine's when it exports its latency histograms


@dataclass(frozen=True, slots=True)
class CalibrationResult:
    fitted: FittedTiming
    prefill: list[PrefillProbe]
    decode: list[DecodeProbe]
    prefill_error: float  # mean |fitted - measured| / measured over the prefill probes
    decode_error: float
    wall_s: float
    warnings: list[str]
    clock: Literal["engine", "client"] = "client"
    # median round trip less the engine's prefill and less a bare round trip (network)
    outside_engine_s: float | None = None
    round_trip_s: float | None = None  # median of GET /v1/models: the network's share
    kv_block_tokens: int | None = None  # the engine's KV block size (vLLM's /metrics)
    kv_capacity_tokens: int | None = None  # its KV blocks times their size

    def prefill_fit(self, probe: PrefillProbe) -> float:
        return self.fitted.prefill_s([(probe.new, probe.cached)])

    def decode_fit(self, probe: DecodeProbe) -> float:
        return self.fitted.decode_step_s(probe.batch, probe.context_tokens)

    def to_json(self) -> dict[str, Any]:
        return {
            "fitted": self.fitted.model_dump(mode="json"),
            "prefill_error": round(self.prefill_error, 6),
            "decode_error": round(self.decode_error, 6),
            "prefill": [
                {"new": p.new, "cached": p.cached, "measured_s": round(p.seconds, 6),
                 "fitted_s": round(self.prefill_fit(p), 6)}
                for p in self.prefill
            ],
            "decode": [
                {"batch": d.batch, "context_tokens": d.context_tokens,
                 "measured_s": round(d.seconds, 6), "fitted_s": round(self.decode_fit(d), 6)}
                for d in self.decode
            ],
            "clock": self.clock,
            "outside_engine_s": None if self.outside_engine_s is None
            else round(self.outside_engine_s, 6),
            "round_trip_s": None if self.round_trip_s is None else round(self.round_trip_s, 6),
            "kv_block_tokens": self.kv_block_tokens,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "wall_s": round(self.wall_s, 3),
            "warnings": self.warnings,
        }  # fmt: skip


async def _prefill_probes(
    engine: ProbeClient, options: CalibrationOptions, step: Callable[[], None], warnings: list[str]
) -> list[PrefillProbe]:
    probes = []
    unreported = uncached = 0
    for cached in options.cached_tokens:
        for new in options.new_tokens:
            times, seen_cached = [], []
            for _ in range(options.repeats):
                prefix = engine.tokens(cached)
                if cached:
                    await engine.complete(prefix)  # the engine caches it
                seconds, reported = await engine.complete(prefix + engine.tokens(new))
                times.append(seconds)
                seen_cached.append(cached if reported is None else reported)
                if cached and reported is None:
                    unreported += 1
                elif cached and reported == 0:
                    uncached += 1
                step()
            hit = int(np.median(seen_cached))
            probes.append(PrefillProbe(new + cached - hit, hit, float(np.median(times))))
    if unreported:
        warnings.append(
            "the engine did not report cached tokens (vLLM: --enable-prompt-tokens-details), "
            "so the cached probes assume their whole prefix was cached"
        )
    if uncached:
        warnings.append(
            f"{uncached} probes after a cached prefix found nothing cached (prefix caching "
            "off, or evicted): their prefixes count as new tokens"
        )
    return probes


def fitting_prompt(
    batch: int, prompt: int, tokens: int, block_tokens: int | None, capacity_tokens: int | None
) -> int:
    """The longest prompt, up to ``prompt``, of which ``batch`` requests generating
    ``tokens`` tokens each fit the engine's KV memory together, each in whole blocks (0 when
    none does; ``prompt`` when the memory is not known). A probe that did not fit would be
    timed with the engine's preemptions and recomputations in it."""
    if capacity_tokens is None:
        return prompt
    block = block_tokens or 1
    per_request = capacity_tokens // batch // block * block
    return max(min(prompt, per_request - tokens), 0)


def decode_shapes(
    options: CalibrationOptions, block_tokens: int | None, capacity_tokens: int | None
) -> tuple[list[tuple[int, int]], list[str]]:
    """The decode probes' (batch, prompt tokens), and a note for each prompt cut to the
    engine's memory. At every batch size a short prompt and the longest that the memory
    holds at that size (up to ``long_prompt``), so that the batch's context varies apart
    from its size by as much as the engine allows and a per-context-token cost small
    beside the per-request one (a small model, short contexts) is still told apart from
    it. A probe that did not fit would be timed with the engine's preemptions and
    recomputations in it; a duplicate shape is probed once. When the engine does not
    report its memory, the long prompts of several requests are cut to half of one
    request's prompt and output, as a guard against preemption."""
    n = options.decode_tokens
    shapes: list[tuple[int, int]] = []
    cut: list[str] = []
    for batch in options.batches:
        longest = options.long_prompt
        if capacity_tokens is None and batch > 1:
            longest = min(longest, max((longest + n) // 2, options.short_prompt))
        for wanted in (options.short_prompt, longest):
            prompt = fitting_prompt(batch, wanted, n, block_tokens, capacity_tokens)
            if prompt > 0 and (batch, prompt) not in shapes:
                shapes.append((batch, prompt))
            if prompt < wanted:
                cut.append(f"{batch} x {wanted} -> {prompt or 'left out'}")
    return shapes, cut


async def _decode_probes(
    engine: ProbeClient,
    options: CalibrationOptions,
    step: Callable[[], None],
    warnings: list[str],
    kv_layout: tuple[int | None, int | None],
) -> list[DecodeProbe]:
    probes = []
    n = options.decode_tokens
    fewer = max(n // 4, 1)
    shapes, cut = decode_shapes(options, *kv_layout)
    for _ in range((2 * len(options.batches) - len(shapes)) * options.repeats):
        step()  # shapes left out or probed once: their share of the progress bar is done
    if cut:
        warnings.append(
            f"decode probes cut to fit the engine's KV memory ({kv_layout[1]:,} tokens) with "
            f"their {n} tokens out, as a preempting engine's timing would not be its steps' "
            f"(requests x prompt tokens): {', '.join(cut)}"
        )
    if not shapes:
        raise UserError(
            f"{options.url}: the engine's KV memory ({kv_layout[1]:,} tokens) holds no decode "
            f"probe; calibrate with a smaller --max-batch or --decode-tokens"
        )
    if len({prompt for _, prompt in shapes}) < 2:
        warnings.append(
            f"every decode probe has {shapes[0][1]}-token prompts, so the batch's context "
            "grows with its size only and the fit cannot tell the cost per context token from "
            "the cost per request: calibrate with a larger --max-prompt or fewer --decode-tokens"
        )

    # by the client's clock each twice, interleaved, keeping the quicker (a stall only
    # ever adds time); the engine's clock has no stalls of the client's to drop
    tries = 1 if engine.engine_clock else 2
    for batch, prompt in shapes:
        medians = []
        for _ in range(options.repeats):
            # B requests at once generating n tokens, and B generating n/4: the prefills
            # (fresh prompts each time) cancel in the difference, which is n - n/4 steps
            short, long = [], []
            for _ in range(tries):
                short.append(await engine.decode_s(batch, prompt, fewer))
                long.append(await engine.decode_s(batch, prompt, n))
            medians.append((min(long) - min(short)) / (n - fewer))
            step()
        seconds = float(np.median(medians))
        if seconds <= 0.0:
            warnings.append(
                f"decode probe of {batch} requests with {prompt}-token prompts left out: "
                f"generating {n} tokens took no longer than {fewer} (a noisy machine?)"
            )
            continue
        probes.append(DecodeProbe(batch, float(batch * (prompt + n / 2)), seconds))
    if len(probes) < 3:
        raise UserError(
            f"{options.url}: too few decode probes could be timed ({len(probes)} of "
            f"{len(shapes)}); calibrate again with more --repeats or --decode-tokens"
        )
    return probes


def probe_count(options: CalibrationOptions) -> int:
    """Measurements ``calibrate`` makes (for a progress bar)."""
    prefill = len(options.cached_tokens) * len(options.new_tokens)
    decode = 2 * len(options.batches)
    return (prefill + decode) * options.repeats


async def _calibrate(options: CalibrationOptions, step: Callable[[], None]) -> CalibrationResult:
    headers = {"authorization": f"Bearer {options.api_key}"} if options.api_key else {}
    started = time.perf_counter()
    async with httpx.AsyncClient(headers=headers, timeout=options.timeout_s) as client:
        await check_answers(client, options.url)
        engine = ProbeClient(
            client, options.url, options.model, options.vocab_size, options.seed,
            await _engine_clock(client, options),
        )  # fmt: skip
        await engine.complete(engine.tokens(64))  # warm-up: first-request compilation
        engine.outside_s.clear()
        round_trip = await round_trip_s(client, options.url) if engine.engine_clock else None
        warnings: list[str] = []
        block_tokens, capacity_tokens = await _kv_layout(client, options.url)
        prefill = await _prefill_probes(engine, options, step, warnings)
        decode = await _decode_probes(
            engine, options, step, warnings, (block_tokens, capacity_tokens)
        )
        if block_tokens is None:
            warnings.append(
                f"{options.url}/metrics does not report the engine's KV block size "
                "(vllm:cache_config_info): set kv_block_tokens and kv_capacity_tokens in the "
                "preset's pools by hand"
            )
    (p0, p1, p2), prefill_error = fit_prefill(prefill)
    (d0, d1, d2), decode_error = fit_decode(decode)
    clock: Literal["engine", "client"] = "engine" if engine.engine_clock else "client"
    # by the engine's clock the passes leave out the server's own time per request; by the
    # client's, the prefill overhead holds it. The network's round trip is not the server's
    # work (and a replay's requests come from elsewhere): it is left out.
    outside = None
    if engine.outside_s:
        outside = max(float(np.median(engine.outside_s)) - (round_trip or 0.0), 0.0)
    fitted = FittedTiming(
        prefill_overhead_s=float(p0), prefill_s_per_token=float(p1),
        prefill_s_per_token_pair=float(p2), decode_overhead_s=float(d0),
        decode_s_per_request=float(d1), decode_s_per_context_token=float(d2),
        frontend_s=outside or 0.0,
        # what was probed: the decode probes' prompts may have been cut to the memory
        probed_prompt_tokens=max(
            max(options.new_tokens) + max(options.cached_tokens),
            *(round(d.context_tokens / d.batch + options.decode_tokens / 2) for d in decode),
        ),
        probed_batch=max(d.batch for d in decode),
        source=f"pdd-router calibrate {options.url} ({clock}'s clock): prefill fit error "
        f"{prefill_error:.1%}, decode {decode_error:.1%}",
    )  # fmt: skip
    return CalibrationResult(
        fitted, prefill, decode, prefill_error, decode_error, time.perf_counter() - started,
        warnings, clock, outside, round_trip, block_tokens, capacity_tokens,
    )  # fmt: skip


async def _kv_layout(client: httpx.AsyncClient, url: str) -> tuple[int | None, int | None]:
    """The engine's KV block size and capacity in tokens, as vLLM reports them at
    ``/metrics`` (``vllm:cache_config_info``); None for what it does not report. vLLM
    keeps its first block as a placeholder (the null block) that no request uses: the
    capacity is the other blocks'."""
    try:
        response = await client.get(f"{url}/metrics", timeout=10)
        load = parse_load(response.text) if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        load = None
    if load is None or load.block_size is None or load.block_size <= 0:
        return None, None
    blocks = load.num_blocks
    usable = blocks - 1 if blocks is not None and blocks > 1 else None
    return load.block_size, usable * load.block_size if usable is not None else None


async def _engine_clock(client: httpx.AsyncClient, options: CalibrationOptions) -> bool:
    """Whether to time by the engine's clock: ``auto`` when it exports its latency
    histograms; ``engine`` insists on them."""
    if options.clock == "client":
        return False
    exported = await read_totals(client, options.url) is not None
    if options.clock == "engine" and not exported:
        raise UserError(
            f"--clock engine: {options.url}/metrics does not export vLLM's request prefill "
            "and decode time histograms; use --clock client (round trips)"
        )
    return exported


def calibrate(
    options: CalibrationOptions, step: Callable[[], None] | None = None
) -> CalibrationResult:
    """Measure the engine at ``options.url`` and fit its pass times; ``step`` is called
    after each measurement."""
    if not options.url.startswith(("http://", "https://")):
        raise UserError(f"--url {options.url!r} is not an http(s) URL")
    if options.repeats < 1:
        raise UserError(f"--repeats must be at least 1, got {options.repeats}")
    return asyncio.run(_calibrate(options, step or (lambda: None)))

"""Drive a live OpenAI-compatible endpoint (one engine, or the router) with a trace.

Each trace request is sent at its timestamp (over ``rate_scale``) as a streaming
``POST /v1/completions`` of token IDs made up from its block IDs (``TokenSynth``: shared
blocks are shared tokens, so the engine's prefix cache hits where the trace's do; drawn
within the model's vocabulary, as ``live_vocabulary`` finds it), with
``max_tokens`` its output length and ``ignore_eos``, greedy. What the client sees is
recorded in the replay's own ``requests.jsonl`` and ``summary.json`` schema: arrival
(the scheduled send time), first and last token, inter-token gaps. A live run sees
neither instances' caches nor the WAN, so those fields hold zeros and empty values,
except the pipeline and instances when the router's ``x-pdd-pipeline`` header and
``pdd`` field name them; ``tokens_md`` holds all the output tokens (the endpoint's
``usage.completion_tokens``, else the tokens counted in the stream), ``reason`` the
error of a request that failed (an error answer's status and the endpoint's message);
the failures are counted by reason in the summary's warnings.

Requests reach the endpoint in the trace's order, those due at the same moment included:
each one is sent, and taken by the server (its answer's headers are back), before the
next one's start (``live_request.InOrder``), so an
engine queueing them first come, first served takes them in the order the replay does
(sent at once over separate connections, the order in which they arrived varied from run
to run, and with it which of a burst waited for memory). At most ``concurrency`` requests
are in flight; a request due while that many are open waits, and the wait counts in its
TTFT, as it would for a client. Stopping early
(``max_requests``, ``duration_s``, or cancellation such as Ctrl-C) keeps what finished:
the records of the requests sent, unfinished ones with no first or last token.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import httpx

from replay.metrics.record import RequestRecord
from replay.metrics.summary import ClientTiming, SlaThresholds, Summary, client_timing, summarize
from replay.metrics.summary_inputs import Observed, RunSetup
from replay.runner.endpoint import check_answers
from replay.runner.live_failures import failures
from replay.runner.live_request import InOrder, Seen, request_body, send_request
from replay.runner.live_vocabulary import DEFAULT_VOCAB, live_vocabulary
from replay.sim.simulator import ProgressObserver
from replay.trace.record import TraceRequest
from replay.trace.token_synth import LOWEST_TOKEN, TokenSynth
from router import __version__
from router.errors import UserError

__all__ = ["NOT_MEASURED", "LiveOptions", "LiveResult", "run_live"]

NOT_MEASURED = (
    "a live run measures what the client sees (latencies, pipelines, rejections): the "
    "WAN, utilization, KV memory, hit rates, cost and BCR figures are not measured and "
    "stay at 0"
)


@dataclass(frozen=True, slots=True)
class LiveOptions:
    """Where and how to send the trace."""

    url: str  # the endpoint's base URL (``/v1/completions`` is appended)
    model: str | None = None
    api_key: str | None = None
    rate_scale: float = 1.0
    max_requests: int | None = None
    duration_s: float | None = None  # send only requests due within this many seconds
    concurrency: int = 64
    vocab_size: int | None = None  # None: the endpoint's (its model card), else 32,000
    seed: int = 0
    timeout_s: float = 600.0  # one request's whole stream
    sla: SlaThresholds = field(default_factory=SlaThresholds)


MOST_FAILED = 0.5
"""A run in which more than this share of the requests sent failed is a failed run."""


@dataclass(frozen=True, slots=True)
class LiveResult:
    summary: Summary
    records: list[RequestRecord]
    errors: dict[str, int]  # the reason a request failed (numbers masked) -> requests
    sent: int = 0  # requests sent (finished, failed, refused or cut short)
    vocab_size: int = DEFAULT_VOCAB  # token IDs were drawn below it

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    @property
    def mostly_failed(self) -> bool:
        """More than ``MOST_FAILED`` of the requests sent failed: the run measured errors."""
        return self.sent > 0 and self.failed > MOST_FAILED * self.sent


def _selected(requests: Sequence[TraceRequest], options: LiveOptions) -> list[TraceRequest]:
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    if not ordered:
        raise UserError("the trace has no requests")
    start = ordered[0].arrival_s
    if options.duration_s is not None:
        limit = options.duration_s * options.rate_scale
        ordered = [r for r in ordered if r.arrival_s - start <= limit]
    if options.max_requests is not None:
        ordered = ordered[: options.max_requests]
    return ordered


def _check(options: LiveOptions) -> None:
    if options.rate_scale <= 0:
        raise UserError(f"--rate-scale must be positive, got {options.rate_scale}")
    if options.concurrency <= 0:
        raise UserError(f"--concurrency must be positive, got {options.concurrency}")
    if options.max_requests is not None and options.max_requests <= 0:
        raise UserError(f"--max-requests must be positive, got {options.max_requests}")
    if options.duration_s is not None and options.duration_s <= 0:
        raise UserError(f"--duration must be positive, got {options.duration_s}")
    if options.vocab_size is not None and options.vocab_size <= LOWEST_TOKEN:
        raise UserError(f"--vocab-size must be above {LOWEST_TOKEN}, got {options.vocab_size}")
    if not options.url.startswith(("http://", "https://")):
        raise UserError(f"--url {options.url!r} is not an http(s) URL")


def _headers(options: LiveOptions) -> dict[str, str]:
    return {"authorization": f"Bearer {options.api_key}"} if options.api_key else {}


LOOP_PROBE_S = 0.01
"""The client's event loop is timed by a sleep this long, over and over."""

LATE_SEND_S = 0.05
"""A client that started sending 1% of requests this late is warned about."""

STALLED_SHARE = 0.01
"""A client whose event loop woke late this share of the time (and ``LATE_SEND_S`` in all,
so that a short run's one late wake-up is not a warning) is warned about: what it
measured is then partly its own delay."""


async def _watch_loop(stalls: array[float]) -> None:
    """Time ``LOOP_PROBE_S`` sleeps until cancelled: how late each wake-up came is how late
    a token arriving then was read (the client was busy, or its machine was)."""
    while True:
        before = time.perf_counter()
        await asyncio.sleep(LOOP_PROBE_S)
        stalls.append(max(time.perf_counter() - before - LOOP_PROBE_S, 0.0))


async def _drive(
    requests: list[TraceRequest],
    options: LiveOptions,
    progress: ProgressObserver | None,
    seen: list[Seen],
    stalls: array[float],
) -> None:
    """Send the requests; ``seen`` gets each one's record as it is sent (so a caller
    interrupted midway still has them), ``stalls`` the client's loop stalls."""
    synth = TokenSynth(options.vocab_size or DEFAULT_VOCAB, options.seed)
    headers = _headers(options)
    # An idle connection is dropped before the server's own keep-alive timeout (uvicorn's,
    # vLLM's: 5 s, httpx's default too), or a request sent on it as the server closes it
    # fails with a ReadError.
    limits = httpx.Limits(max_connections=options.concurrency + 1, keepalive_expiry=2.0)
    timeout = httpx.Timeout(options.timeout_s, connect=10.0)
    slots = asyncio.Semaphore(options.concurrency)
    order = InOrder()
    start = requests[0].arrival_s
    finished = 0
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout) as client:
        await check_answers(client, options.url)
        if progress is not None:
            progress.start(len(requests))
        t0 = time.perf_counter()

        async def one(request: TraceRequest, due: float) -> None:
            nonlocal finished
            record = Seen(request, due)
            seen.append(record)
            body = request_body(options.model, synth.prompt(request), request.output_length)
            # how late it starts sending: what follows is the wait for a --concurrency
            # slot (the option's, left out) and the request itself (connecting, and the
            # requests due before it sending theirs, included)
            record.send_lag_s = max(time.perf_counter() - t0 - due, 0.0)
            async with slots:
                try:
                    sent = send_request(client, options.url, body, record, t0, order)
                    await asyncio.wait_for(sent, options.timeout_s)
                except TimeoutError:
                    record.error = "timeout"
                except httpx.HTTPError as exc:
                    record.error = type(exc).__name__
                except asyncio.CancelledError:
                    record.error = "cancelled"
                    raise
                except Exception as exc:  # one odd answer must not lose the whole run
                    record.error = f"bad answer: {type(exc).__name__}"
            finished += 1
            if progress is not None:
                progress.advance(finished)

        tasks: list[asyncio.Task[None]] = []
        watch = asyncio.create_task(_watch_loop(stalls))
        try:
            for request in requests:
                due = (request.arrival_s - start) / options.rate_scale
                delay = due - (time.perf_counter() - t0)
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(request, due)))
            await asyncio.gather(*tasks)
        finally:  # cancelled (Ctrl-C): stop what is in flight, keep what finished
            for task in (*tasks, watch):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, watch, return_exceptions=True)


def _record(seen: Seen) -> RequestRecord:
    request = seen.request
    done = seen.error is None and seen.first_s is not None and seen.last_s is not None
    tokens = seen.reported_tokens if seen.reported_tokens is not None else seen.tokens
    on_rld = tokens if seen.pipeline == "P-RLD" else 0  # P-RLD-MD's split is not seen
    ttft = seen.first_s - seen.arrival_s if done and seen.first_s is not None else None
    e2e = seen.last_s - seen.arrival_s if done and seen.last_s is not None else None
    tpot = None
    if done and seen.first_s is not None and seen.last_s is not None and tokens > 1:
        tpot = (seen.last_s - seen.first_s) / (tokens - 1)

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 6)

    return RequestRecord(
        request_id=request.request_id, session_id=request.session_id,
        arrival_s=round(seen.arrival_s, 6), input_length=request.input_length,
        output_length=request.output_length, decided_pipeline=seen.pipeline,
        pipeline=seen.pipeline, reactive=False, handoff=None, handoff_rounds=0,
        eager_tokens=0, p_instance=seen.instances.get("p", ""),
        rld_instance=seen.instances.get("rld"), md_instance=seen.instances.get("md"),
        finished_on=None, ttft_s=r(ttft), ttft_prefill_s=None, tpot_s=r(tpot),
        max_gap_s=r(seen.max_gap_s) if done else None, handoff_gap_s=None, e2e_s=r(e2e),
        prefill_queue_s=0.0, prefill_s=0.0, hit_p=0.0, hit_rld=None, hit_md=None,
        predicted_hit_p=None, predicted_hit_md=None, predicted_wan_s=0.0, wan_bytes=0.0,
        transfer_s=None, tokens_rld=on_rld, tokens_md=tokens - on_rld, rld_busy_s=None,
        reason=seen.error or "", rejected=seen.rejected,
    )  # fmt: skip


def run_live(
    requests: Sequence[TraceRequest],
    options: LiveOptions,
    *,
    trace_name: str = "<memory>",
    progress: ProgressObserver | None = None,
) -> LiveResult:
    """Send the trace to ``options.url`` and record what the client saw."""
    _check(options)
    selected = _selected(requests, options)
    started = time.perf_counter()
    seen: list[Seen] = []
    stalls: array[float] = array("d")
    interrupted = False
    vocab, vocab_warning = asyncio.run(
        live_vocabulary(options.url, options.model, _headers(options), options.vocab_size)
    )
    try:
        asyncio.run(_drive(selected, replace(options, vocab_size=vocab), progress, seen, stalls))
    except KeyboardInterrupt:  # Ctrl-C: keep the requests sent so far
        interrupted = True
    records = sorted((_record(s) for s in seen), key=lambda r: (r.arrival_s, r.request_id))
    errors, warnings = failures(s.error for s in seen if s.error is not None)
    if vocab_warning is not None:
        warnings.append(vocab_warning)
    if interrupted:
        warnings.append(f"interrupted: {len(seen)} of {len(selected)} requests were sent")
    lags = [s.send_lag_s for s in seen if s.send_lag_s is not None]
    client = client_timing(lags, stalls, LOOP_PROBE_S)
    late = _late_client(client)
    if late:
        warnings.append(late)
    warnings.append(NOT_MEASURED)
    setup = RunSetup(
        policy="live", preset=f"live:{options.url}", trace=trace_name, sla=options.sla,
        seed=options.seed, rate_scale=options.rate_scale, index_mode="live", version=__version__,
    )  # fmt: skip
    observed = Observed(wall_s=time.perf_counter() - started, warnings=warnings, client=client)
    summary = summarize(records, setup, None, observed)
    return LiveResult(summary, records, errors, sent=len(seen), vocab_size=vocab)


def _late_client(client: ClientTiming) -> str | None:
    """A warning when the client's own delays are large enough to weigh in its figures."""
    parts = []
    lag = client.send_lag_s.p99
    if lag is not None and lag >= LATE_SEND_S:
        parts.append(f"its P99 request was sent {lag * 1e3:.0f} ms after it was due")
    share = client.loop_stalled_share
    if share is not None and share >= STALLED_SHARE and client.loop_stalled_s >= LATE_SEND_S:
        parts.append(
            f"its event loop woke late {share:.1%} of the time (at most "
            f"{(client.loop_stall_s_max or 0.0) * 1e3:.0f} ms at once)"
        )
    if not parts:
        return None
    return (
        f"the client ran late: {' and '.join(parts)}; the latencies it measured include "
        "these delays (send from a less busy machine)"
    )

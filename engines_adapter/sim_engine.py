"""An in-process simulated engine: the adapter contract with a toy model and a real prefix cache.

No GPU, no network: a deterministic toy model (the next token is a function of the
whole context, so extend-decode from prompt + eager tokens continues exactly), a
block prefix cache with LRU eviction that reports cached prompt tokens and publishes
KV events, optional timing (real asyncio sleeps only when configured), a bounded
number of running requests (the rest wait), and fault injection for failover tests.
Used by replay, by the demo server (behind ``sim_server``) and by the contract tests.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engines_adapter.contract import (
    EngineError,
    EngineLoad,
    Feature,
    GenerateRequest,
    KVEvent,
    KVEventBatch,
    PrefillResult,
    TokenDelta,
)
from engines_adapter.kv_events import with_gap
from engines_adapter.sim_cache import ChainBlock, SimEngineCache
from engines_adapter.sim_outputs import TextEncoder, fake_logprob, forced_tokens
from engines_adapter.toy_model import ToyModel

__all__ = ["RequestTimes", "SimEngine", "SimEngineConfig", "SimFaults"]

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]


class SimEngineConfig(BaseModel):
    """How a simulated engine behaves; every instance of one deployment shares the model."""

    model_config = ConfigDict(extra="forbid")

    block_size: int = Field(16, gt=0)
    vocab_size: int = Field(512, ge=2)
    cache_blocks: int = Field(4096, gt=0)  # KV capacity in blocks
    max_running: int = Field(64, gt=0)  # more requests than this wait
    prefill_s_per_token: float = Field(0.0, ge=0)  # per uncached prompt token
    decode_s_per_token: float = Field(0.0, ge=0)
    eos_token_id: int | None = None  # None: never stops before max_tokens
    # the token IDs generation draws from, uniformly (repeat one to make it likelier; include
    # eos_token_id to stop); None: the whole vocabulary
    output_token_ids: list[int] | None = Field(None, min_length=1)
    model_seed: int = 0  # the toy model; equal on every instance of a deployment
    hash_seed: int = Field(0, ge=0)  # the cache's own block hashes, like an engine's
    event_queue_size: int = Field(10_000, gt=0)  # per KV-event subscriber

    @model_validator(mode="after")
    def _outputs_in_vocabulary(self) -> SimEngineConfig:
        bad = [t for t in self.output_token_ids or () if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"output_token_ids: {bad[0]} is not below vocab_size")
        return self


class SimFaults(BaseModel):
    """Faults to inject; change them on a running engine (``engine.faults.refuse = True``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    healthy: bool = True  # what health() reports
    refuse: bool = False  # every new request fails with a retryable EngineError
    fail_after_tokens: int | None = Field(None, ge=0)  # streams fail after this many tokens
    hang: bool = False  # requests stall until aborted
    busy_next: int = Field(0, ge=0)  # the server answers this many next completions 429


@dataclass(slots=True)
class _Run:
    request_id: str
    context: list[int]
    pinned: list[ChainBlock] = field(default_factory=list)
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    state: int = 0
    cached_tokens: int = 0
    scheduled_at: float = 0.0  # perf_counter when it got a slot
    first_at: float | None = None  # when its first token was produced
    last_at: float = 0.0


@dataclass(slots=True)
class RequestTimes:
    """Totals over the requests that produced a token, as vLLM's histograms count them:
    seconds from getting a slot to the first token, and from the first to the last."""

    requests: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0


@dataclass(slots=True)
class _Subscription:
    queue: asyncio.Queue[KVEventBatch | None]
    lost: int = 0


class SimEngine:
    """One simulated engine instance implementing ``EngineAdapter``."""

    def __init__(
        self,
        instance_id: str,
        config: SimEngineConfig | None = None,
        *,
        faults: SimFaults | None = None,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = time.time,
        text_encoder: TextEncoder | None = None,
    ) -> None:
        """``text_encoder``: the model's tokenizer, for structured output (without one, the
        engine does not offer it)."""
        self.instance_id = instance_id
        self.text_encoder = text_encoder
        self.features: frozenset[Feature] = frozenset(
            {"logprobs", "structured_output"} if text_encoder is not None else {"logprobs"}
        )
        self.config = config or SimEngineConfig()
        self.faults = faults or SimFaults()
        outputs = self.config.output_token_ids
        self.model = ToyModel(
            self.config.vocab_size,
            self.config.model_seed,
            tuple(outputs) if outputs is not None else None,
        )
        self.cache = SimEngineCache(
            self.config.block_size, self.config.cache_blocks, self.config.hash_seed
        )
        self._sleep = sleep
        self._clock = clock
        self._slots = asyncio.Semaphore(self.config.max_running)
        self._running: dict[str, _Run] = {}
        self._waiting = 0
        self._queries = 0
        self._hits = 0
        self._sequence = -1
        self.times = RequestTimes()
        self._subscriptions: list[_Subscription] = []
        self._closed = False

    # -- contract -------------------------------------------------------------------

    async def prefill(self, request: GenerateRequest, *, targets: int = 1) -> PrefillResult:
        """Prefill the prompt into the cache and return the first token."""
        run = await self._start(request)
        try:
            if self.faults.hang:
                await run.aborted.wait()
            if run.aborted.is_set():
                raise EngineError(self.instance_id, f"prefill {request.request_id} aborted")
            if self.faults.fail_after_tokens == 0:
                raise EngineError(self.instance_id, "injected failure during prefill")
            run.first_at = run.last_at = time.perf_counter()
            return PrefillResult(
                request_id=request.request_id,
                first_token_id=self.model.next_token(run.state),
                cached_tokens=run.cached_tokens,
                kv_transfer_params={
                    "remote_instance": self.instance_id,
                    "request_id": request.request_id,
                    "targets": targets,
                    "num_tokens": len(request.prompt_token_ids),
                },
            )
        finally:
            self._finish(run)

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[TokenDelta, None]:
        """Stream one token per delta; the first delta carries the cached prompt tokens.
        Structured output writes a JSON value the schema accepts, then EOS."""
        forced: list[int] | None = None
        if request.structured is not None:
            if self.text_encoder is None:
                raise EngineError(self.instance_id, "structured output: no tokenizer",
                                  cause="request")  # fmt: skip
            eos = self.config.eos_token_id
            prompt = request.prompt_token_ids
            forced, done = forced_tokens(request.structured, self.text_encoder, prompt, eos)
            forced = forced[done:]
        run = await self._start(request)
        try:
            if forced == []:  # the first engine wrote the whole answer before the handoff
                yield TokenDelta(token_ids=[], finished=True, finish_reason="stop")
                return
            state = run.state
            for i in range(request.max_tokens):
                if self.faults.hang:
                    await run.aborted.wait()
                if run.aborted.is_set():
                    yield TokenDelta(token_ids=[], finished=True, finish_reason="abort")
                    return
                if self.faults.fail_after_tokens is not None and i >= self.faults.fail_after_tokens:
                    raise EngineError(self.instance_id, f"injected failure after {i} tokens")
                if self.config.decode_s_per_token > 0:
                    await self._sleep(self.config.decode_s_per_token)
                else:
                    await asyncio.sleep(0)  # let other requests (and aborts) in
                if run.aborted.is_set():
                    yield TokenDelta(token_ids=[], finished=True, finish_reason="abort")
                    return
                token = self.model.next_token(state) if forced is None else forced[i]
                logprobs = None
                if request.logprobs is not None:
                    top = fake_logprob(state, token, request.logprobs, self.config.vocab_size)
                    logprobs = [top]
                state = self.model.step(state, token)
                self._append(run, token)
                run.last_at = time.perf_counter()
                if run.first_at is None:
                    run.first_at = run.last_at
                stop = token == self.config.eos_token_id and not request.ignore_eos
                stop = stop or (forced is not None and i == len(forced) - 1)
                last = stop or i == request.max_tokens - 1
                yield TokenDelta(
                    token_ids=[token],
                    finished=last,
                    finish_reason=("stop" if stop else "length") if last else None,
                    cached_tokens=run.cached_tokens if i == 0 else None,
                    logprobs=logprobs,
                )
                if stop:
                    return
        finally:
            self._finish(run)

    async def abort(self, request_id: str) -> None:
        """Stop a running (or hung) request; unknown ids are ignored."""
        run = self._running.get(request_id)
        if run is not None:
            run.aborted.set()

    async def load(self) -> EngineLoad:
        """Running and waiting requests, KV usage, cumulative prefix-cache tokens."""
        return self.snapshot()

    def snapshot(self) -> EngineLoad:
        """``load()`` without awaiting (for a metrics collector)."""
        bs = self.config.block_size
        used = sum(math.ceil(len(r.context) / bs) for r in self._running.values())
        return EngineLoad(
            running=len(self._running),
            waiting=self._waiting,
            kv_usage=min(1.0, used / self.config.cache_blocks),
            prefix_cache_queries=float(self._queries),
            prefix_cache_hits=float(self._hits),
            block_size=bs,
            num_blocks=self.config.cache_blocks,
        )

    async def health(self) -> bool:
        """True unless closed or made unhealthy by a fault."""
        return self.faults.healthy and not self._closed

    async def kv_events(self) -> AsyncGenerator[KVEventBatch, None]:
        """Batches from now on; a subscriber that falls behind gets a gap-marked batch."""
        sub = _Subscription(asyncio.Queue(maxsize=self.config.event_queue_size))
        self._subscriptions.append(sub)
        try:
            while True:
                batch = await sub.queue.get()
                if batch is None:
                    return
                if sub.lost:
                    batch, sub.lost = with_gap(batch, sub.lost), 0
                yield batch
        finally:
            self._subscriptions.remove(sub)

    async def aclose(self) -> None:
        """Abort running requests and end KV-event streams."""
        self._closed = True
        for run in list(self._running.values()):
            run.aborted.set()
        for sub in self._subscriptions:
            self._offer(sub, None)

    # -- engine-side operations (not in the contract) -------------------------------

    def is_running(self, request_id: str) -> bool:
        """Whether a request with this id is admitted and not finished."""
        return request_id in self._running

    def reset_prefix_cache(self) -> None:
        """Drop the whole prefix cache, publishing AllBlocksCleared."""
        self._publish(self.cache.clear())

    # -- internals --------------------------------------------------------------------

    def _check(self, request: GenerateRequest) -> None:
        if self._closed:
            raise EngineError(self.instance_id, "engine is shut down")
        if not request.prompt_token_ids:
            raise EngineError(self.instance_id, "empty prompt", cause="request")
        vocab = self.config.vocab_size
        bad = [t for t in request.prompt_token_ids if not 0 <= t < vocab]
        if bad:
            raise EngineError(
                self.instance_id,
                f"token id {bad[0]} out of vocabulary (vocab_size {vocab})",
                cause="request",
            )
        if request.request_id in self._running:
            raise EngineError(
                self.instance_id, f"request {request.request_id} already runs", cause="request"
            )
        if self.faults.refuse:
            raise EngineError(self.instance_id, "refusing requests (injected fault)")

    async def _start(self, request: GenerateRequest) -> _Run:
        """Admit (waiting for a slot), look up and fill the prefix cache, charge prefill time."""
        self._check(request)
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        prompt = request.prompt_token_ids
        run = _Run(request.request_id, list(prompt), scheduled_at=time.perf_counter())
        self._running[run.request_id] = run
        try:
            bs = self.config.block_size
            blocks = self.cache.chain(prompt, salt=_salt(request))
            # Like vLLM, at least the last prompt token is computed, never served from cache.
            hit_blocks = self.cache.match(blocks[: (len(prompt) - 1) // bs])
            run.cached_tokens = hit_blocks * bs
            self._queries += len(prompt)
            self._hits += run.cached_tokens
            params = request.kv_transfer_params or {}
            remote = params.get("remote_instance")
            transferred = remote is not None and remote != self.instance_id
            uncached = 0 if transferred else len(prompt) - run.cached_tokens
            if self.config.prefill_s_per_token > 0 and uncached > 0:
                await self._sleep(uncached * self.config.prefill_s_per_token)
            self._publish(self.cache.store(blocks, pin=True))
            run.pinned = blocks
            run.state = self.model.state_of(prompt)
        except BaseException:
            self._finish(run)
            raise
        return run

    def _append(self, run: _Run, token: int) -> None:
        """Extend a running request's context, caching each block it fills."""
        run.context.append(token)
        bs = self.config.block_size
        if len(run.context) % bs == 0:
            parent = run.pinned[-1].block_hash if run.pinned else None
            block = self.cache.block(parent, run.context[-bs:])
            self._publish(self.cache.store([block], pin=True))
            run.pinned.append(block)

    def _finish(self, run: _Run) -> None:
        if self._running.get(run.request_id) is run:
            if run.first_at is not None:
                self.times.requests += 1
                self.times.prefill_s += run.first_at - run.scheduled_at
                self.times.decode_s += run.last_at - run.first_at
            del self._running[run.request_id]
            self.cache.unpin(run.pinned)
            self._slots.release()

    def _publish(self, events: Sequence[KVEvent]) -> None:
        if not events:
            return
        self._sequence += 1
        batch = KVEventBatch(
            instance_id=self.instance_id,
            timestamp=self._clock(),
            sequence=self._sequence,
            events=list(events),
        )
        for sub in self._subscriptions:
            self._offer(sub, batch)

    @staticmethod
    def _offer(sub: _Subscription, batch: KVEventBatch | None) -> None:
        try:
            sub.queue.put_nowait(batch)
        except asyncio.QueueFull:
            sub.lost += 1


def _salt(request: GenerateRequest) -> str | None:
    """The request's ``cache_salt`` (vLLM's field, among the sampling fields), if any."""
    salt = request.sampling.get("cache_salt")
    return salt if isinstance(salt, str) and salt else None

"""An in-process simulated engine: the adapter contract with a toy model and a real prefix
cache (LRU, cached-token counts, KV events), optional timing, bounded running requests and
fault injection; used by replay, the demo server (``engine_sim.server``) and the tests.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from engine_sim.cache import ChainBlock, SimEngineCache
from engine_sim.config import HOLD_POLL_S, SimEngineConfig, SimFaults
from engine_sim.outputs import TextEncoder, fake_logprob, forced_tokens
from engine_sim.request_times import RequestTimes
from engine_sim.toy_model import ToyModel
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

__all__ = ["RequestTimes", "SimEngine", "SimEngineConfig", "SimFaults"]

_REPICK = 0x5851F42D4C957F2D
"""Mixed into the state to pick the opening token that replaces EOS."""

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]


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
    tokens: int = 0  # tokens it generated


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
                first_token_id=(
                    self.model.next_token(run.state)
                    if request.ignore_eos
                    else self._opening(run.state)
                ),
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
        forced = self._forced(request)
        run = await self._start(request)
        try:
            if forced == []:  # the first engine wrote the whole answer before the handoff
                yield TokenDelta(token_ids=[], finished=True, finish_reason="stop")
                return
            state = run.state
            for i in range(request.max_tokens):
                if not await self._step_allowed(run, i):
                    yield TokenDelta(token_ids=[], finished=True, finish_reason="abort")
                    return
                token = self._choose(request, state, i, forced)
                logprobs = None
                if request.logprobs is not None:
                    top = fake_logprob(state, token, request.logprobs, self.config.vocab_size)
                    logprobs = [top]
                state = self.model.step(state, token)
                self._append(run, token)
                run.tokens += 1
                now = time.perf_counter()
                if run.first_at is None:
                    run.first_at = now
                elif run.tokens > 1:  # a gap after the request's previous token
                    self.times.token(now - run.last_at)
                run.last_at = now
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

    def _forced(self, request: GenerateRequest) -> list[int] | None:
        """With structured output, the tokens still to write (None: free generation)."""
        if request.structured is None:
            return None
        if self.text_encoder is None:
            raise EngineError(self.instance_id, "structured output: no tokenizer",
                              cause="request")  # fmt: skip
        eos = self.config.eos_token_id
        prompt = request.prompt_token_ids
        forced, done = forced_tokens(request.structured, self.text_encoder, prompt, eos)
        return forced[done:]

    async def _step_allowed(self, run: _Run, i: int) -> bool:
        """Wait out one decode step (or a hang); False when the request was aborted; an
        injected failure raises."""
        if self.faults.hang:
            await run.aborted.wait()
        if run.aborted.is_set():
            return False
        if self.faults.fail_after_tokens is not None and i >= self.faults.fail_after_tokens:
            raise EngineError(self.instance_id, f"injected failure after {i} tokens")
        if self.config.decode_s_per_token > 0:
            await self._sleep(self.config.decode_s_per_token)
        else:
            await asyncio.sleep(0)  # let other requests (and aborts) in
        return not run.aborted.is_set()

    def _choose(
        self, request: GenerateRequest, state: int, i: int, forced: list[int] | None
    ) -> int:
        """The ``i``-th output token: the structured answer's, else the model's (never
        end-of-turn first, unless the request ignores it)."""
        if forced is not None:
            return forced[i]
        if i == 0 and not request.ignore_eos:
            return self._opening(state)
        return self.model.next_token(state)

    async def abort(self, request_id: str) -> None:
        """Stop a running (or hung) request; unknown ids are ignored."""
        run = self._running.get(request_id)
        if run is not None:
            run.aborted.set()

    async def load(self) -> EngineLoad:
        """Running and waiting requests, KV usage, cumulative prefix-cache tokens and
        inter-token gaps."""
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
            itl_sum_s=self.times.itl_s,
            itl_count=float(self.times.gaps),
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

    def _opening(self, state: int) -> int:
        """The first token a call produces (unless it ignores EOS): the model's, unless
        that is EOS, which would end the answer before it began (an empty answer, which
        a client of a real model seldom sees and load tools count as an error); then
        another of the tokens the model emits, picked by the state too. An extend-decode
        (prompt + eager tokens) whose uninterrupted decode would end right at the
        handoff goes on a little longer than that decode."""
        token = self.model.next_token(state)
        eos = self.config.eos_token_id
        if token != eos:
            return token
        pick = ((state ^ _REPICK) * _REPICK % (1 << 64)) >> 24
        outputs = self.config.output_token_ids
        if outputs is not None:
            others = [t for t in outputs if t != eos]
            return others[pick % len(others)] if others else token
        other = pick % (self.config.vocab_size - 1)  # every ID but EOS, in order
        return other + (other >= token)

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
            while self.faults.hold and not run.aborted.is_set():  # running, not yet computed
                await asyncio.sleep(HOLD_POLL_S)
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

"""A decode instance (RLD or MD): KV memory, admission queues, a fluid decode batch.

A copy of a request's KV first reserves memory here (``DecodeAdmission``: its chain's
blocks pinned, the blocks already cached reused, its prompt's tail), waiting in FIFO
order when the memory is full; then its bytes travel; once landed the request joins the
batch, or waits for a slot when ``max_batch`` requests are running. Joining emits one token
at once (the token the prefill, or the handoff's extend step, produced); the rest
come from the fluid batch.

Memory for the output is taken as it is generated (``on_demand``, as vLLM and SGLang
allocate blocks): the running requests' generated tokens grow at the batch size times
the step rate, so the moment the memory fills is known in advance and has one event.
Then unpinned cached blocks are evicted; when none is left, the request that started
last is preempted (vLLM's order): its memory is freed (its blocks stay cached) and it
waits at the head of ``DecodeAdmission``'s queue; re-admitted, it recomputes its prompt
and what it had generated (a prefill pass over what is no longer cached) and emits its
next token.
Without ``on_demand`` the whole output is reserved at admission (the legs' extra
tokens include it) and nothing is ever preempted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from policies.tiers import Tier
from policies.types import InstanceLoad
from replay.presets.schema import DecodeRecomputes
from replay.sim.decode_admission import DecodeAdmission
from replay.sim.decode_batch import DecodeBatch
from replay.sim.event_loop import EventLoop
from replay.sim.events import Priority
from replay.sim.frontend import Frontend
from replay.sim.growing_memory import GrowingMemory
from replay.sim.kv_memory import KvMemory
from replay.sim.request_state import Leg, LegState, SimRequest
from replay.sim.step_costs import StepCosts

__all__ = ["DecodeInstance"]


class DecodeInstance:
    """One RLD or MD instance."""

    __slots__ = (
        "_admission",
        "_frontend",
        "_growth",
        "_loop",
        "_on_finish",
        "_ready",
        "_running",
        "batch",
        "cache",
        "datacenter",
        "first_token_on_decode",
        "id",
        "is_rld",
        "load",
        "max_batch",
        "on_demand",
        "preemptions",
        "recomputes",
        "step_costs",
        "tier",
    )

    def __init__(
        self,
        loop: EventLoop,
        instance_id: str,
        tier: Tier,
        datacenter: str,
        load: InstanceLoad,
        cache: KvMemory,
        step_costs: StepCosts,
        max_batch: int,
        on_reserved: Callable[[Leg], None],
        on_finish: Callable[[SimRequest, DecodeInstance], None],
        first_token_on_decode: bool = False,
        on_demand: bool = False,
        recomputes: DecodeRecomputes = "none",
    ) -> None:
        self._loop = loop
        self.recomputes = recomputes  # TimingSpec.decode_recomputes
        self.on_demand = on_demand
        self.preemptions = 0
        self.first_token_on_decode = first_token_on_decode
        self.id = instance_id
        self.tier = tier
        self.is_rld = tier == Tier.RLD  # asked on every start and end of a decode
        self.datacenter = datacenter
        self.load = load
        self.cache = cache
        self.step_costs = step_costs
        self.max_batch = max_batch
        self.batch = DecodeBatch(loop, step_costs.decode_step_s, self._batch_finished)
        self._growth = (
            GrowingMemory(loop, cache, self.batch, self._preempt, self._sync_load)
            if on_demand
            else None
        )
        self._admission = DecodeAdmission(
            loop, cache, step_costs, on_reserved=on_reserved, rejoin=self.join,
            refresh=self._refresh_grown, sync_load=self._sync_load,
        )  # fmt: skip
        self._on_finish = on_finish
        self._ready: deque[tuple[Leg, int]] = deque()
        self._running: dict[int, SimRequest] = {}
        self._frontend = Frontend(loop, step_costs.frontend_s, self._taken_in)

    # -- memory -----------------------------------------------------------------------

    def reserve(self, leg: Leg) -> None:
        """Reserve memory for a copy of the KV; ``on_reserved(leg)`` once it is granted."""
        self._admission.reserve(leg)

    def landed(self, leg: Leg) -> None:
        """The KV of ``leg`` has arrived."""
        self._admission.landed(leg)
        self._sync_load()

    def close(self, leg: Leg) -> None:
        """Release the copy: unpin its blocks (they stay cached), free its reservation."""
        if leg.state == LegState.CLOSED:
            return
        if leg.running:
            raise RuntimeError(f"request {leg.request.key} is still decoding on {self.id}")
        if self._admission.withdraw(leg):  # it held no memory
            return
        if leg.queued:
            self._ready = deque(item for item in self._ready if item[0] is not leg)
            leg.queued = False
        self._admission.release(leg)

    # -- decoding ---------------------------------------------------------------------

    def arrive(self, leg: Leg) -> None:
        """The request reaches this instance's server, an engine call of its own (the
        router's, once the prefill or the handoff is done): it joins the batch with what
        is left of its output once the server has taken it (``Frontend``: a calibrated
        pool's ``frontend_s``, one request after another)."""
        self._frontend.submit(leg.request)
        self._sync_load()

    def _taken_in(self, request: SimRequest) -> None:
        leg = self._leg_of(request)
        if leg.state == LegState.CLOSED or request.finished:
            self._sync_load()  # its server no longer holds it
            return  # dropped while the server held it (RLD finished, or the handoff moved)
        self.join(leg, request.output_length - request.emitted)

    def join(self, leg: Leg, tokens_left: int) -> None:
        """Start emitting the request's last ``tokens_left`` tokens (or wait for a slot)."""
        if len(self._running) < self.max_batch:
            self._start(leg, tokens_left)
        else:
            leg.queued = True
            self._ready.append((leg, tokens_left))
            self._sync_load()

    def _start(self, leg: Leg, tokens_left: int) -> None:
        request, now = leg.request, self._loop.now
        leg.running = True
        self._running[request.key] = request
        if self._growth is not None:  # the generated tokens it brings count as grown now
            self.cache.reserved -= leg.resume_tokens
            leg.resume_tokens = 0
            leg.grown_base = request.emitted
            self._growth.base += request.emitted
        if self.first_token_on_decode and request.emitted == 0:
            self._start_from_first_step(request, tokens_left, now)
            return
        request.emit(1, now, on_rld=self.is_rld)
        if self.is_rld and request.rld_start_s is None:
            request.rld_start_s = now
        request.stint_join_s = now
        request.stint_tokens = tokens_left - 1
        if request.stint_tokens > 0:
            context = request.input_length + request.emitted
            self.batch.join(request.key, request.stint_tokens, context)
            self._grow(leg)
        else:
            self._loop.after(0.0, Priority.DECODE, self._finish_now, request)
        self._sync_load()

    def _start_from_first_step(self, request: SimRequest, tokens: int, now: float) -> None:
        """Every token from this instance's steps, the first one too: it reaches the client
        one step after joining (the step's length as the batch stands with it)."""
        if self.is_rld and request.rld_start_s is None:
            request.rld_start_s = now
        request.stint_join_s = now
        request.stint_tokens = tokens
        first_pass = self._first_pass_s(request.input_length)
        batch = self.batch
        start = max(now, batch.held_until)  # a pass in progress ends first
        batch.join(request.key, tokens, request.input_length)
        self._grow(self._leg_of(request))
        step = batch.step_s()
        if first_pass is not None and first_pass > step:  # the pass holds the whole batch
            self._loop.at(batch.hold(first_pass - step), Priority.DECODE, self._released)
            step = first_pass
        request.first_token_s = start + step
        self._sync_load()

    def _released(self, _: object) -> None:
        self.batch.release()
        self._sync_load()  # the batch's memory grows again

    def _first_pass_s(self, prompt: int) -> float | None:
        """The first pass of a request whose KV a transfer brought, when this engine
        computes part of its prompt itself (``TimingSpec.decode_recomputes``): a prefill
        pass over those tokens, alone or on top of the running batch's step (None: a plain
        decode step). The batch makes no progress meanwhile beyond that step (``hold``):
        its other members' next token waits for the pass, as in a real engine's step."""
        if self.recomputes == "none":
            return None
        if self.recomputes == "last-token":
            tail = 1
        else:  # partial-block: the whole blocks before the prompt's last token moved
            block = self.cache.page_tokens or self.cache.block_size
            tail = prompt - max(prompt - 2, 0) // block * block
        tail = min(max(tail, 1), prompt)
        batch = self.batch
        context = batch.context_tokens() if batch.size else 0.0
        return self.step_costs.mixed_step_s(batch.size, context, tail, prompt - tail)

    def _grow(self, leg: Leg) -> None:
        """The request's memory grows with the batch from now (``GrowingMemory.join``)."""
        if self._growth is not None:
            chain_tokens = len(leg.request.chain) * self.cache.block_size
            held = chain_tokens + leg.extra_tokens + leg.resume_tokens + leg.grown_base
            self._growth.join(leg.request.key, held)

    def emitted_now(self, request: SimRequest) -> int:
        """Tokens the request has emitted by now, counting its progress here."""
        return request.emitted_in(self.batch)

    def leave(self, leg: Leg) -> None:
        """Stop decoding the request now (handoff); its tokens so far are accounted."""
        request = leg.request
        if request.key in self.batch:
            request.leave_batch(self.batch, self._loop.now, on_rld=self.is_rld)
        self._stop(request, leg)
        self._admit_ready()

    def _stop(self, request: SimRequest, leg: Leg) -> None:
        """The request no longer runs here: its generated tokens' memory is freed."""
        if self._running.pop(request.key, None) is not None and self._growth is not None:
            self._growth.base -= leg.grown_base
            self._growth.forget(request.key)
            leg.grown_base = 0
        leg.running = False

    def _leg_of(self, request: SimRequest) -> Leg:
        leg = request.rld_leg if self.is_rld else request.md_leg
        if leg is None:
            raise RuntimeError(f"request {request.key} has no copy on {self.id}")
        return leg

    def _batch_finished(self, key: int) -> None:
        request = self._running[key]
        self._stop(request, self._leg_of(request))
        gap = self.batch.gap_at_exit.pop(key)
        request.account_stint(request.stint_tokens, self._loop.now, gap, on_rld=self.is_rld)
        self._finished(request)

    def _finish_now(self, request: SimRequest) -> None:
        if request.key in self._running:
            self._stop(request, self._leg_of(request))
            self._finished(request)

    def _finished(self, request: SimRequest) -> None:
        self._admit_ready()
        self._on_finish(request, self)

    def _admit_ready(self) -> None:
        ready = self._ready
        while ready and len(self._running) < self.max_batch:
            leg, tokens_left = ready.popleft()
            leg.queued = False
            self._start(leg, tokens_left)
        self._sync_load()

    def _sync_load(self) -> None:
        load, cache = self.load, self.cache
        load.running = len(self._running)
        load.queued = self._admission.waiting + len(self._ready) + self._frontend.waiting
        load.step_s = self.batch.step_s()
        if self._growth is not None:
            self._growth.arm()
        load.kv_used_tokens = int(cache.pinned_tokens)

    # -- on-demand memory: preemption as the batch grows --------------------------------

    def _refresh_grown(self) -> None:
        if self._growth is not None:
            self._growth.refresh()

    def _preempt(self) -> None:
        """Free the request that started last and queue it first for re-admission; one
        that could never be taken back (its prompt and output so far beyond the memory)
        is passed over, and so is one whose stint's last token is out (its end, at this
        instant, frees its memory); when every one is, the batch overcommits instead."""
        request = next(
            (
                r
                for r in (self._running[key] for key in reversed(self._running))
                if r.key in self.batch
                and not r.stint_done_in(self.batch)
                and self.cache.could_hold(
                    r.chain, self._leg_of(r).extra_tokens + r.emitted_in(self.batch)
                )
            ),
            None,
        )
        if request is None:
            return
        leg = self._leg_of(request)
        self.leave(leg)
        self.preemptions += 1
        request.preemptions += 1
        self._admission.preempted(leg)

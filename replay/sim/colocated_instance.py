"""A colocated instance: one engine that prefills and decodes, scheduled as vLLM does.

A calibrated engine's server first takes each request (``FittedTiming.frontend_s``, one
after another, as a single API server process does), and streams a first token only once
it is through the requests it holds (``Frontend.busy_until``). Requests then wait in
arrival order (a preempted one at the head) until the engine has a slot (``max_batch``
requests admitted) and memory for the prompt; its prefix cache gives them its blocks.
Each engine step processes at most ``step_tokens`` tokens (vLLM's
``max_num_batched_tokens``): one for every decoding request, the rest for the prefills in
admission order (chunked prefill). In fluid form the decode batch gains a token per step and
the prefills ``step_tokens - batch`` tokens per step, a step taking one decode step plus the
chunk's prefill pass (``StepCosts.mixed_step_s``). Steps are tracked as the prefill consumes
them (``_step_room``: the tokens left of the current step's chunk): a request whose prefill
ends inside a step gets its first token when that step ends (when the chunk is spent or no
prefill is left), as every request finishing in one vLLM step does, and then joins the
decode batch.
Memory for the output is taken as it is generated (``GrowingMemory``) unless the output is
reserved at admission (``on_demand`` false). When the growing batch fills the memory, the
request admitted last is preempted: its memory and its progress are lost, and it comes
back first to recompute its prompt and what it had generated; the engine admits nothing
else for the step that preempted. It is busy (``busy_time``) while it admits requests.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from policies.tiers import Tier
from policies.types import InstanceLoad
from replay.sim.busy_time import BusyTime
from replay.sim.decode_batch import DecodeBatch
from replay.sim.event_loop import EventLoop
from replay.sim.events import Priority
from replay.sim.frontend import Frontend
from replay.sim.growing_memory import GrowingMemory
from replay.sim.kv_memory import KvMemory
from replay.sim.request_state import SimRequest
from replay.sim.step_costs import StepCosts

__all__ = ["ColocatedInstance"]


class _Admitted:
    """What an admitted request holds on the instance."""

    __slots__ = ("cached", "extra", "grown_base", "resumed", "work")

    def __init__(self, extra: int, work: int, cached: int, resumed: int) -> None:
        self.extra = extra  # reserved tokens beyond the chain's blocks
        self.resumed = resumed  # of which the generated tokens a recompute brings back
        self.work = work  # tokens its prefill computes (prompt misses, generated tokens)
        self.cached = cached  # prompt tokens its prefill found cached
        self.grown_base = 0  # generated tokens it held when it joined the batch


class ColocatedInstance:
    """One engine serving whole requests: its prefill and its decode."""

    __slots__ = (
        "_admitted",
        "_backlog",
        "_frontend",
        "_growth",
        "_held",
        "_loop",
        "_on_finish",
        "_on_stored",
        "_prefill",
        "_prefill_left",
        "_prefill_speed",
        "_prefill_t",
        "_prefill_version",
        "_ready",
        "_requests",
        "_reserve_output",
        "_step_room",
        "_waiting",
        "_waiting_tokens",
        "batch",
        "busy_time",
        "cache",
        "datacenter",
        "id",
        "load",
        "max_batch",
        "preemptions",
        "step_costs",
        "step_tokens",
        "tier",
    )

    def __init__(
        self,
        loop: EventLoop,
        instance_id: str,
        datacenter: str,
        load: InstanceLoad,
        cache: KvMemory,
        step_costs: StepCosts,
        *,
        max_batch: int,
        step_tokens: int,
        on_demand: bool,
        on_stored: Callable[[str, Sequence[int]], None],
        on_finish: Callable[[SimRequest, ColocatedInstance], None],
    ) -> None:
        self._loop = loop
        self.id = instance_id
        self.tier = Tier.P  # the router sees it as a P instance (it also decodes)
        self.datacenter = datacenter
        self.load = load
        self.cache = cache
        self.step_costs = step_costs
        self.max_batch = max_batch
        self.step_tokens = step_tokens
        self.preemptions = 0
        self._reserve_output = not on_demand
        self._on_stored = on_stored
        self._on_finish = on_finish
        self.batch = DecodeBatch(loop, self._step_s, self._decoded)
        self._growth = (
            GrowingMemory(loop, cache, self.batch, self._preempt, self._evicted)
            if on_demand
            else None
        )
        self._waiting: deque[SimRequest] = deque()
        self._waiting_tokens = 0
        self._admitted: dict[int, _Admitted] = {}  # by key, in admission order
        self._prefill: deque[SimRequest] = deque()  # admitted, prefill unfinished, FIFO
        self._backlog = 0  # prefill tokens of the admitted requests, the head's in full
        self._prefill_left = 0.0  # tokens left of the head's prefill
        self._prefill_speed = 0.0
        self._prefill_t = loop.now
        self._prefill_version = 0
        self._step_room = float(step_tokens)  # prefill tokens left in the current step
        self._ready: list[SimRequest] = []  # prefilled in this step: first token at its end
        self._held = False  # a preemption holds admissions for a step (or till an end)
        self._requests: dict[int, SimRequest] = {}
        self._frontend = Frontend(loop, step_costs.frontend_s, self._enqueue, step_costs.dispatch_s)
        self.busy_time = BusyTime()  # while it holds admitted requests (prefill or decode)

    # -- what the simulator calls -----------------------------------------------------

    def submit(self, request: SimRequest) -> None:
        """Queue the whole request (prefill and decode), after the engine's server has
        taken it (``Frontend``)."""
        if self._frontend.submit(request):
            self._sync_load()

    def _enqueue(self, request: SimRequest) -> None:
        self._waiting.append(request)
        self._waiting_tokens += request.input_length
        self._admit()

    def release(self, request: SimRequest) -> None:
        """Nothing to do: the KV never leaves this instance."""

    # -- admission --------------------------------------------------------------------

    def _admit(self) -> None:
        waiting, cache = self._waiting, self.cache
        while waiting and not self._held and len(self._admitted) < self.max_batch:
            request = waiting[0]
            generated = request.emitted  # more than 0 after a preemption: recomputed too
            extra = request.private_tokens + generated
            if self._reserve_output:
                extra += request.output_length - generated
            extra += cache.padding(len(request.chain) * cache.block_size + extra)
            if self._growth is not None:
                self._growth.refresh()
            hits = cache.acquire(request.chain, extra)
            if hits is None:
                break  # head of line: vLLM's FCFS waits for the head
            waiting.popleft()
            self._waiting_tokens -= request.input_length
            cached = cache.cached_tokens(hits, request.input_length)
            work = max(request.input_length - cached, 1) + generated
            if request.preemptions == 0:
                request.p_hit_tokens = cached
                request.new_tokens = work
                request.prefill_start_s = self._loop.now
            self._admitted[request.key] = _Admitted(extra, work, cached, generated)
            self._requests[request.key] = request
            self._advance_prefill()
            if not self._prefill:
                self._prefill_left = work
                if not self._ready:  # the engine was decoding only: a new step starts
                    self._step_room = self._budget()
            self._prefill.append(request)
            self._backlog += work
        self._retime()

    # -- the engine's steps -------------------------------------------------------------

    def _remaining(self) -> float:
        """Prefill tokens still to compute, over every admitted request."""
        if not self._prefill:
            return 0.0
        head = self._admitted[self._prefill[0].key].work
        return self._backlog - head + max(self._prefill_left, 0.0)

    def _budget(self) -> float:
        """Prefill tokens a step starting now may take: what the decoding requests leave."""
        return float(max(self.step_tokens - self.batch.size, 1))

    def _chunk(self, batch: int) -> float:
        """Prefill tokens of one step: the budget the decoding requests leave."""
        return min(float(max(self.step_tokens - batch, 0)), self._remaining())

    def _step_s(self, batch: int, context: float) -> float:
        if not self._prefill:
            return self.step_costs.decode_step_s(batch, context)
        head = self._admitted[self._prefill[0].key]
        done = head.work - self._prefill_left
        return self.step_costs.mixed_step_s(
            batch, context, max(self._chunk(batch), 1.0), head.cached + done
        )

    def _head_done(self) -> bool:
        """The head's prefill has no token left (to rounding)."""
        work = self._admitted[self._prefill[0].key].work
        return self._prefill_left <= 1e-6 * max(work, 1)

    def _advance_prefill(self) -> None:
        now = self._loop.now
        if self._prefill_speed > 0.0:
            done = self._prefill_speed * (now - self._prefill_t)
            self._prefill_left -= done
            self._step_room -= done
        self._prefill_t = now

    def _retime(self) -> None:
        """The batch or the prefills changed: new step time, rates and next events."""
        self._advance_prefill()
        batch = self.batch
        batch.refresh()
        self._prefill_speed = 0.0
        self._prefill_version += 1  # whatever was scheduled is stale now
        if self._prefill:
            chunk = self._chunk(batch.size)
            step = self._step_s(batch.size, batch.context_tokens())
            if self._head_done():  # it ended just now: its token comes at once
                self._loop.after(0.0, Priority.PREFILL, self._prefilled, self._prefill_version)
            elif chunk > 0.0 and step > 0.0:
                self._prefill_speed = chunk / step
                # the next event: the head's prefill or the step ends, whichever comes first
                # (a step's cost grows with the context before its chunk: each is re-timed)
                delay = min(self._prefill_left, max(self._step_room, 0.0)) / self._prefill_speed
                self._loop.after(delay, Priority.PREFILL, self._prefilled, self._prefill_version)
        elif self._ready:  # the prefill left in the step was preempted: the step ends now
            self._loop.after(0.0, Priority.PREFILL, self._prefilled, self._prefill_version)
        if self._growth is not None:
            self._growth.arm()
        self._sync_load()

    def _prefilled(self, version: int) -> None:
        """The head's prefill or the current step ended (or both)."""
        if version != self._prefill_version:
            return
        self._advance_prefill()
        if self._prefill_speed > 0.0:
            # timed for this moment: the nearer of the two limits is reached, whatever the
            # rounding left of it (far from time 0, a remainder of a few ulps would be
            # timed again at this same instant, forever)
            low = min(self._prefill_left, self._step_room)
            if self._prefill_left <= low:
                self._prefill_left = 0.0
            if self._step_room <= low:
                self._step_room = 0.0
        if self._prefill and self._head_done():
            request = self._prefill.popleft()
            self._backlog -= self._admitted[request.key].work
            if self._prefill:
                self._prefill_left = self._admitted[self._prefill[0].key].work
            self._on_stored(self.id, self.cache.kept(request.chain))
            self._ready.append(request)
        if self._step_room <= 1e-6 * self.step_tokens or not self._prefill:
            self._end_step()
        self._retime()

    def _end_step(self) -> None:
        """The step ends: the requests it prefilled get their first token and decode."""
        ready, self._ready = self._ready, []
        now = self._loop.now
        ended: list[SimRequest] = []
        for request in ready:
            if request.emitted == 0:
                request.prefill_end_s = now
                # the server streams it once it is through the requests it is taking in
                request.emit(1, self._frontend.busy_until(), on_rld=False)
            else:
                request.emit(1, now, on_rld=False)
            left = request.output_length - request.emitted
            if left <= 0:
                ended.append(request)
                continue
            held = self._admitted[request.key]
            if self._growth is not None:  # what it had generated counts as grown from now on
                resumed = held.resumed
                held.extra -= resumed
                self.cache.reserved -= resumed
                held.resumed = 0
                held.grown_base = request.emitted
                self._growth.base += request.emitted
            request.stint_join_s = now
            request.stint_tokens = left
            context = request.input_length + request.emitted
            self.batch.join(request.key, left, context)
            if self._growth is not None:
                chain_tokens = len(request.chain) * self.cache.block_size
                self._growth.join(request.key, chain_tokens + held.extra + held.grown_base)
        self._step_room = self._budget()
        for request in ended:
            self._end(request)

    def _decoded(self, key: int) -> None:
        request = self._requests[key]
        gap = self.batch.gap_at_exit.pop(key)
        request.account_stint(request.stint_tokens, self._loop.now, gap, on_rld=False)
        self._end(request)

    def _end(self, request: SimRequest) -> None:
        self._free(request)
        self._held = False
        self._admit()
        self._on_finish(request, self)

    def _free(self, request: SimRequest) -> None:
        held = self._admitted.pop(request.key)
        del self._requests[request.key]
        if self._growth is not None:
            self._growth.base -= held.grown_base
            self._growth.forget(request.key)
        self.cache.release(request.chain, held.extra)

    # -- preemption -------------------------------------------------------------------

    def _preempt(self) -> None:
        """Free the request admitted last; it waits at the head to be recomputed. One that
        could never be taken back (its prompt and output so far beyond the memory) is
        passed over, and so is one whose last token is out (its end, at this instant, frees
        its memory); when every one is, the engine overcommits instead."""
        key = next((key for key in reversed(self._admitted) if self._preemptible(key)), None)
        if key is None:
            return
        request = self._requests[key]
        held = self._admitted[key]
        if key in self.batch:
            request.leave_batch(self.batch, self._loop.now, on_rld=False)
        elif request in self._ready:  # prefilled, its first token not out yet
            self._ready.remove(request)
        else:  # still prefilling: its progress is lost
            self._advance_prefill()
            head = self._prefill[0] is request
            self._prefill.remove(request)
            self._backlog -= held.work
            if head and self._prefill:
                self._prefill_left = self._admitted[self._prefill[0].key].work
        self._free(request)
        self.preemptions += 1
        request.preemptions += 1
        self._waiting.appendleft(request)
        self._waiting_tokens += request.input_length
        self._held = True  # as vLLM admits nothing in a step that preempted
        step = self._step_s(self.batch.size, self.batch.context_tokens())
        self._loop.after(step, Priority.PREFILL, self._release, self.preemptions)
        self._admit()

    def _preemptible(self, key: int) -> bool:
        request = self._requests[key]
        if request.stint_done_in(self.batch):
            return False
        emitted = request.emitted_in(self.batch)
        return self.cache.could_hold(request.chain, request.private_tokens + emitted)

    def _release(self, preemption: int) -> None:
        """The step that preempted (the latest one) is over: admissions resume."""
        if self._held and preemption == self.preemptions:
            self._held = False
            self._admit()

    def _evicted(self) -> None:
        if self._growth is not None:
            self._growth.arm()
        self._sync_load()

    # -- what the router sees ------------------------------------------------------------

    def _sync_load(self) -> None:
        load = self.load
        load.running = len(self._admitted)
        self.busy_time.set(bool(self._admitted), self._loop.now)
        front = self._frontend
        load.queued = len(self._waiting) + front.waiting
        load.queued_prefill_tokens = (
            int(self._remaining()) + self._waiting_tokens + front.waiting_tokens
        )
        load.kv_used_tokens = int(self.cache.pinned_tokens)

"""A decode instance's KV memory for the copies it receives: reserved in FIFO order, and
taken back for the requests its growing batch preempted.

A copy of a request's KV first reserves memory here (its chain's blocks pinned, the
blocks already cached reused, its prompt's tail), waiting in FIFO order when the memory
is full. A preempted request (``DecodeInstance`` chooses which) has its memory freed, its
blocks staying cached, and waits at the head of the queue; after a preemption nothing is
admitted until a request frees memory (vLLM admits nothing in a step that preempted).
Re-admitted, it recomputes its prompt and what it had generated (a prefill pass over
what is no longer cached) and rejoins the batch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from replay.sim.event_loop import EventLoop
from replay.sim.events import Priority
from replay.sim.kv_memory import KvMemory
from replay.sim.request_state import Leg, LegState
from replay.sim.step_costs import StepCosts

__all__ = ["DecodeAdmission"]


class DecodeAdmission:
    """The copies waiting for memory, on their way, or recomputing after a preemption."""

    __slots__ = (
        "_cache",
        "_held",
        "_incoming",
        "_loop",
        "_on_reserved",
        "_prealloc",
        "_preempted",
        "_recomputing",
        "_refresh",
        "_rejoin",
        "_step_costs",
        "_sync_load",
    )

    def __init__(
        self,
        loop: EventLoop,
        cache: KvMemory,
        step_costs: StepCosts,
        *,
        on_reserved: Callable[[Leg], None],
        rejoin: Callable[[Leg, int], None],
        refresh: Callable[[], None],
        sync_load: Callable[[], None],
    ) -> None:
        """``on_reserved(leg)`` once a copy has its memory; ``rejoin(leg, tokens)`` once a
        re-admitted request has recomputed; ``refresh()`` brings the batch's grown memory up
        to date before memory is taken; ``sync_load()`` tells the router what changed."""
        self._loop = loop
        self._cache = cache
        self._step_costs = step_costs
        self._on_reserved = on_reserved
        self._rejoin = rejoin
        self._refresh = refresh
        self._sync_load = sync_load
        self._prealloc: deque[Leg] = deque()
        self._preempted: deque[Leg] = deque()  # freed by a preemption, next to re-admit
        self._incoming = 0
        self._recomputing = 0
        self._held = False  # a preemption holds admissions until memory is freed

    @property
    def waiting(self) -> int:
        """Copies not yet decoding here: waiting for memory, on their way, preempted or
        recomputing (the router counts them queued)."""
        return len(self._prealloc) + self._incoming + len(self._preempted) + self._recomputing

    def reserve(self, leg: Leg) -> None:
        """Reserve memory for a copy of the KV; ``on_reserved(leg)`` once it is granted."""
        if self._preempted or self._prealloc or not self._try_reserve(leg):
            self._prealloc.append(leg)
            self._sync_load()

    def _try_reserve(self, leg: Leg) -> bool:
        request = leg.request
        self._refresh()
        hits = self._cache.acquire(request.chain, leg.extra_tokens)
        if hits is None:
            return False
        leg.hit_tokens = self._cache.cached_tokens(hits, request.input_length)
        leg.state = LegState.SENDING
        self._incoming += 1
        self._sync_load()
        self._on_reserved(leg)
        return True

    def drain(self) -> None:
        """Admit what waits, preempted requests first, while the memory has room."""
        if self._held:  # after a preemption, nothing starts until a request frees memory
            self._sync_load()
            return
        preempted = self._preempted
        while preempted and self._try_readmit(preempted[0]):
            preempted.popleft()
        prealloc = self._prealloc
        while not preempted and prealloc and self._try_reserve(prealloc[0]):
            prealloc.popleft()
        self._sync_load()

    def landed(self, leg: Leg) -> None:
        """The KV of ``leg`` has arrived."""
        leg.state = LegState.LANDED
        self._incoming -= 1

    def withdraw(self, leg: Leg) -> bool:
        """Close a copy that holds no memory (still waiting for it, or preempted): True
        when ``leg`` was one, the others waiting admitted as the memory allows."""
        if leg.state == LegState.RESERVING:
            self._prealloc.remove(leg)
        elif leg.preempted:  # its memory was freed when it was preempted
            self._preempted.remove(leg)
            leg.preempted = False
        else:
            return False
        leg.state = LegState.CLOSED
        self.drain()  # it may have been the head the others waited behind
        return True

    def release(self, leg: Leg) -> None:
        """Close a copy that holds memory: unpin its blocks (they stay cached), free its
        reservation, and admit what waits."""
        if leg.recomputing:
            leg.recomputing = False
            self._recomputing -= 1
        if leg.state == LegState.SENDING:
            self._incoming -= 1
        leg.state = LegState.CLOSED
        self._cache.release(leg.request.chain, leg.extra_tokens + leg.resume_tokens)
        leg.resume_tokens = 0
        self._held = False
        self.drain()

    def preempted(self, leg: Leg) -> None:
        """``leg``'s request was preempted (it no longer runs): free its memory and queue it
        first for re-admission; nothing is admitted until a request frees memory."""
        leg.preempted = True
        self._cache.release(leg.request.chain, leg.extra_tokens)
        self._preempted.appendleft(leg)
        self._held = True  # as vLLM admits nothing in a step that preempted
        self.drain()

    def _try_readmit(self, leg: Leg) -> bool:
        """Memory again for a preempted request, its generated tokens included; then a
        prefill pass recomputes what is no longer cached."""
        request = leg.request
        generated = request.emitted
        cache = self._cache
        # its generated tokens, and with engine blocks the rest of the block they end in
        # (the copy's reservation pads the prompt alone)
        prompt = len(request.chain) * cache.block_size + request.private_tokens
        resume = generated + cache.padding(prompt + generated) - cache.padding(prompt)
        self._refresh()
        hits = cache.acquire(request.chain, leg.extra_tokens + resume)
        if hits is None:
            return False
        leg.preempted = False
        leg.recomputing = True
        leg.resume_tokens = resume
        self._recomputing += 1
        cached = cache.cached_tokens(hits, request.input_length)
        work = [(request.input_length - cached + generated, cached)]
        self._loop.after(self._step_costs.prefill_s(work), Priority.DECODE, self._recomputed, leg)
        return True

    def _recomputed(self, leg: Leg) -> None:
        if not leg.recomputing:
            return  # closed meanwhile (handed off or finished elsewhere)
        leg.recomputing = False
        self._recomputing -= 1
        request = leg.request
        self._rejoin(leg, max(request.output_length - request.emitted, 1))

"""A P instance: a prefill queue in front of a prefix cache, timed by its step costs."""

from __future__ import annotations

from collections.abc import Callable

from policies.tiers import Tier
from policies.types import InstanceLoad
from replay.sim.event_loop import EventLoop
from replay.sim.frontend import Frontend
from replay.sim.kv_memory import KvMemory
from replay.sim.prefill_queue import PrefillQueue
from replay.sim.request_state import SimRequest
from replay.sim.step_costs import StepCosts

__all__ = ["PrefillInstance"]


class PrefillInstance:
    """Prefill in FIFO batches; only tokens missing from the prefix cache are computed.

    The prompt's blocks stay pinned on P after the prefill until every copy of the
    KV has left (``release``): P holds a request's KV until it is shipped.
    """

    __slots__ = (
        "_frontend",
        "_loop",
        "busy_time",
        "cache",
        "datacenter",
        "id",
        "load",
        "queue",
        "step_costs",
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
        batch_tokens: int,
        on_prefilled: Callable[[SimRequest], None],
    ) -> None:
        self._loop = loop
        self.id = instance_id
        self.tier = Tier.P
        self.datacenter = datacenter
        self.load = load
        self.cache = cache
        self.step_costs = step_costs
        self.queue: PrefillQueue[SimRequest] = PrefillQueue(
            loop,
            self._cost,
            on_prefilled,
            admit=self._admit,
            batch_tokens=batch_tokens,
            on_change=self._sync_load,
        )
        self._frontend = Frontend(loop, step_costs.frontend_s, self._enqueue, step_costs.dispatch_s)
        self.busy_time = self.queue.busy_time  # while a prefill batch runs

    def submit(self, request: SimRequest) -> None:
        """Queue the request's prefill, after the engine's server has taken it
        (``Frontend``: a calibrated pool's ``frontend_s``)."""
        if self._frontend.submit(request):
            self._sync_load()

    def _enqueue(self, request: SimRequest) -> None:
        queue = self.queue
        if queue.idle and self._admit(request):
            queue.run_alone(request)  # no queue to size it for: its cached prefix is known
            return
        cache = self.cache
        held = cache.cached_tokens(cache.leading_blocks(request.chain), request.input_length)
        estimate = max(request.input_length - held, 1)
        self.queue.submit(request, estimate)

    def release(self, request: SimRequest) -> None:
        """Every copy of the KV has left P: unpin it (it stays cached) and go on."""
        self.cache.release(request.chain, self._extra(request))
        self._sync_load()
        self.queue.kick()

    def _admit(self, request: SimRequest) -> bool:
        hits = self.cache.acquire(request.chain, self._extra(request))
        if hits is None:
            return False
        hit_tokens = self.cache.cached_tokens(hits, request.input_length)
        request.p_hit_tokens = hit_tokens
        request.new_tokens = max(request.input_length - hit_tokens, 1)
        request.prefill_start_s = self._loop.now
        return True

    def _extra(self, request: SimRequest) -> int:
        """What the request holds beyond its chain's blocks: its block-less prompt tail and
        the rest of its last page."""
        cache, private = self.cache, request.private_tokens
        return private + cache.padding(len(request.chain) * cache.block_size + private)

    def _cost(self, batch: list[SimRequest]) -> float:
        return self.step_costs.prefill_s([(r.new_tokens, r.p_hit_tokens) for r in batch])

    def _sync_load(self) -> None:
        load, queue = self.load, self.queue
        load.running = len(queue.running)
        load.queued = len(queue) + self._frontend.waiting
        load.queued_prefill_tokens = queue.queued_tokens + self._frontend.waiting_tokens
        load.kv_used_tokens = int(self.cache.pinned_tokens)

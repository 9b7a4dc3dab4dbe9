"""What a ``Simulator`` is set up with besides its cluster, decider and index: the run's
settings (plain values) and its hooks (callables called as requests end)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from replay.sim.kv_events import KV_EVENT_DELAY_S

if TYPE_CHECKING:
    from replay.sim.request_state import SimRequest

__all__ = ["ProgressObserver", "SimHooks", "SimSettings"]


class ProgressObserver(Protocol):
    """Told how many requests there are and how many have finished (a progress bar)."""

    def start(self, total: int) -> None: ...

    def advance(self, finished: int) -> None: ...


@dataclass(frozen=True, slots=True)
class SimSettings:
    """``seed`` drives the line's fluctuation. ``kv_events`` False: engines publish nothing
    (the router's index is what it records itself). ``index_knows_capacity`` False
    registers instances without their KV capacity, so the index bounds nothing (a router
    not told the engines' cache sizes). ``kv_event_wan_delay_s``: how much later still the
    events of instances outside the prefill pool's datacenter (where the router decides)
    reach its index, e.g. the line's one-way delay when each datacenter keeps its own
    index. ``timeline_period_s``: sample the tiers' and the line's load that often.
    ``step_cost_scale``: every engine pass takes this many times its priced cost
    (``ScaledStepCosts``)."""

    seed: int = 0
    kv_event_delay_s: float = KV_EVENT_DELAY_S
    kv_event_wan_delay_s: float = 0.0
    kv_events: bool = True
    index_knows_capacity: bool = True
    timeline_period_s: float | None = None
    step_cost_scale: float = 1.0


@dataclass(frozen=True, slots=True)
class SimHooks:
    """``on_finished(request)`` runs when a request ends (the outcome join). ``sink(request)``:
    each request is handed over once it has ended (the unfinished ones when the run ends,
    in arrival order) and then forgotten, so memory holds only the requests in flight;
    without a sink ``Simulator.requests`` keeps every one. ``progress`` is told how many
    requests have finished."""

    progress: ProgressObserver | None = None
    on_finished: Callable[[SimRequest], None] | None = None
    sink: Callable[[SimRequest], None] | None = None

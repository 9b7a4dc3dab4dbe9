"""The discrete-event simulator of a two-datacenter PDD cluster."""

from __future__ import annotations

from replay.sim.event_loop import EventLoop
from replay.sim.events import Priority
from replay.sim.link import Link, Transfer
from replay.sim.prefill_queue import PrefillQueue
from replay.sim.prefix_cache import PrefixCache
from replay.sim.roofline import Roofline
from replay.sim.simulator import Decider, ProgressObserver, Simulator

__all__ = [
    "Decider",
    "EventLoop",
    "Link",
    "PrefillQueue",
    "PrefixCache",
    "Priority",
    "ProgressObserver",
    "Roofline",
    "Simulator",
    "Transfer",
]

"""Event kinds of the simulator; their order breaks ties between events at the same time."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["Priority"]


class Priority(IntEnum):
    """Lower runs first among events at the same simulated time.

    KV events reach the index before anything decides; completions free capacity
    before new work claims it; arrivals come last so that a request arriving at the
    same instant as a completion sees the freed capacity.
    """

    KV_EVENT = 0  # an engine's KV event reaches the router's index
    LINK = 1  # a transfer drained, was delivered, or the bandwidth changed
    DECODE = 2  # a request finished its decode on an instance
    HANDOFF = 3  # an extend-decode chunk was digested on MD
    PREFILL = 4  # a prefill batch finished
    ARRIVAL = 5  # a request arrives at the router
    SAMPLE = 6  # the timeline samples the cluster (after everything else at that instant)

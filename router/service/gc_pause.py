"""The garbage collector's pauses, kept short in a serving process.

CPython's collector stops every thread, the event loop's among them, while it walks the
objects of the generation it collects; a full collection walks every container object
the process holds. A router holds hundreds of thousands of them from start-up alone
(modules, the web framework's routes and schemas, settings, tokenizers loaded by
then), and a request that allocates many objects (a KV-event batch of megabytes is tens
of thousands of events) sets off full collections: each held the event loop, /healthz
included, for 250-500 ms (tests/integration/test_body_limits.py, seen through
``pdd_router_event_loop_held_seconds``).

So once the service has started, what the process holds is collected once and then
frozen (``gc.freeze``): later collections walk only what was allocated since. Objects
frozen are still freed when their last reference goes; only a reference cycle among
them, broken later, is never collected, which for what exists at start-up (built once,
kept for the life of the process) costs little: what is built at start-up and dropped
later in a cycle (a removed instance's poller, a replaced Redis connection) stays
allocated, a bounded amount per change.
"""

from __future__ import annotations

import gc

__all__ = ["settle_heap"]


def settle_heap() -> int:
    """Collect what is garbage now, then move every object left out of the collector's
    sight; the number of objects frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()

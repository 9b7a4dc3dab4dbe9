"""How long a request waits for a slot on a decode instance that is full.

A decode instance runs at most ``max_batch`` requests (fewer when its KV memory is what
runs out: then some wait with slots free). A request reaching a full instance waits
behind those already waiting for the running ones to finish. Each running request holds
its slot for about its output's length in decode steps, so slots free at about
``running / life_s`` per second. The step is the instance's own when its driver knows it
(the replay's decode batch; live, the growth of the engine's inter-token latency
histogram between two load polls), else the cluster's typical step (32 requests), which
is shorter than a full batch's.
"""

from __future__ import annotations

from policies.types import InstanceLoad

__all__ = ["slot_wait_s"]


def slot_wait_s(instance: InstanceLoad, life_s: float, arrive_in_s: float) -> float:
    """Seconds a request reaching ``instance`` in ``arrive_in_s`` waits there before its
    first step: 0 while it has a slot free and nobody waiting; else the requests ahead of
    it (those waiting, those on their way, and itself) times ``life_s`` (a running
    request's time on the instance) over the running requests, less ``arrive_in_s``."""
    slots = instance.running + instance.pending
    if instance.queued == 0 and slots < instance.max_batch:
        return 0.0
    ahead = instance.queued + max(slots - instance.max_batch, 0) + 1
    freeing = max(instance.running, 1)
    return max(ahead * life_s / freeing - arrive_in_s, 0.0)

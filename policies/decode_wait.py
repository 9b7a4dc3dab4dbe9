"""How long a request waits for a slot on a decode instance that is full.

A decode instance runs at most ``max_batch`` requests. Those it runs, those waiting there
(for a slot, or for their KV to land) and those on their way to it (still prefilling)
all want a slot; once they are more than ``max_batch``, a new request waits behind the
excess for running ones to finish. A full batch frees a slot every ``life_s /
max_batch`` seconds, ``life_s`` being how long a request holds its slot: about its
output's length in decode steps. The step is the instance's own when its driver knows it
(the replay's decode batch; live, the growth of the engine's inter-token latency
histogram between two load polls), else the cluster's typical step (32 requests), which
is shorter than a full batch's. A batch limited by KV memory before ``max_batch`` is not
modelled: its wait is predicted as none.
"""

from __future__ import annotations

from policies.types import InstanceLoad

__all__ = ["slot_wait_s"]


def slot_wait_s(instance: InstanceLoad, life_s: float, arrive_in_s: float) -> float:
    """Seconds a request reaching ``instance`` in ``arrive_in_s`` waits there for a slot:
    0 while the requests running, waiting and on their way leave one free; else the
    excess ahead of it (itself included) times ``life_s / max_batch``, less
    ``arrive_in_s``."""
    demand = instance.running + instance.queued + instance.pending
    if demand < instance.max_batch:
        return 0.0
    ahead = demand - instance.max_batch + 1
    return max(ahead * life_s / max(instance.max_batch, 1) - arrive_in_s, 0.0)

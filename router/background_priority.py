"""The router's bulk work runs at a lower CPU priority than its event loop.

The event loop answers ``/healthz``, forwards every streamed token and makes every
routing decision; the router's bulk work (tokenizing prompts, decoding posted KV-event
batches, rendering request templates) runs in worker threads and processes beside it.
When the CPUs are all busy, the kernel shares them by weight: a worker at ``nice`` 10
weighs about a tenth of the loop's thread, so the loop gets a CPU first and the bulk work
takes what is left (Linux sets a nice value per thread). Where that cannot be set (not
Linux, or a sandbox that refuses it) everything runs at one priority, as before.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["BACKGROUND_NICE", "background_executor", "lower_priority"]

BACKGROUND_NICE = 10
"""How much lower than the router's loop its bulk work runs (nice values add)."""


def lower_priority(nice: int = BACKGROUND_NICE) -> None:
    """Lower the calling thread's CPU priority by ``nice`` (at most to 19).

    On Linux ``setpriority`` with a thread id sets that thread only; a process calling it
    from its main thread before starting others lowers them too."""
    with contextlib.suppress(OSError, AttributeError):
        tid = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(current + nice, 19))


def background_executor(workers: int, name: str) -> ThreadPoolExecutor:
    """A thread pool whose threads run at the bulk work's lower priority."""
    return ThreadPoolExecutor(workers, thread_name_prefix=name, initializer=lower_priority)

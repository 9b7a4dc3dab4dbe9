"""Work done for hostile or bulk input runs at a lower CPU priority than the event loop.

The event loop answers ``/healthz``, forwards every streamed token and makes every
routing decision. Two kinds of work beside it need no such hurry and can be made to burn
CPU by a client: rendering a chat template a request supplied (its worker processes) and
decoding a posted batch of KV events (its threads). When the CPUs are all busy, the
kernel shares them by weight: at ``nice`` 10 such work weighs about a tenth of the loop's
thread, so the loop gets a CPU first (Linux sets a nice value per thread). Tokenizing
stays at the loop's priority: every request waits for it, and on a host shared with
engines it would otherwise wait behind them. Where a nice value cannot be set (not
Linux, or a sandbox that refuses it) everything runs at one priority.
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

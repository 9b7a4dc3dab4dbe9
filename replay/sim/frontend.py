"""An engine's server in front of its engine: it takes requests one after another.

A calibrated pool's ``FittedTiming.frontend_s`` is the time a request spends in the
engine's server outside the engine's passes (receiving it, handing it over, sending its
first token back). One API server process does that work for one request at a time, so
requests arriving together reach the engine ``frontend_s`` apart. On a colocated engine a
first token the engine produces while the server still holds requests waits until it is
through them, as in an asyncio server whose request handlers run before its output
handler: a burst's first tokens come out together. Under a steady load near one request
per ``frontend_s`` that holds first tokens for the server's whole queue, which a real
server, interleaving the two, may not. (P instances do not hold theirs: with PD, the first
token comes from the decode side.) A decode instance (RLD or MD) takes each request the
router hands it, once the prefill or the handoff is done, through its server too, before
it joins the batch (``DecodeInstance.arrive``), once the copy has landed: a real decode
engine's server takes the request before its engine pulls the KV, so under a burst of
long transfers the replay puts in turn what a real one overlaps with them. Without a
calibrated value (0) a request reaches the engine at once.

``delay_s`` is a time every request spends before the engine has it that does not hold
the others (the engine's per-request CPU dispatch that kernel measurements do not see,
``PerfDbCosts.dispatch_s``): it adds to the request's latency, not to the server's queue.
"""

from __future__ import annotations

from collections.abc import Callable

from replay.sim.event_loop import EventLoop
from replay.sim.events import Priority
from replay.sim.request_state import SimRequest

__all__ = ["Frontend"]


class Frontend:
    """FIFO, ``seconds`` per request, then ``on_taken(request)``. ``waiting`` and
    ``waiting_tokens`` (prompt tokens) count the requests it holds: the instance's load
    includes them, so a router sees a burst it has sent even before the engine does."""

    __slots__ = (
        "_free_at", "_loop", "_on_taken", "delay_s", "seconds", "waiting", "waiting_tokens",
    )  # fmt: skip

    def __init__(
        self,
        loop: EventLoop,
        seconds: float,
        on_taken: Callable[[SimRequest], None],
        delay_s: float = 0.0,
    ) -> None:
        self._loop = loop
        self.seconds = seconds
        self.delay_s = delay_s
        self._on_taken = on_taken
        self._free_at = loop.now  # when the server is done with the requests it holds
        self.waiting = 0
        self.waiting_tokens = 0

    def submit(self, request: SimRequest) -> bool:
        """Whether the server holds the request (False: taken at once)."""
        if self.seconds <= 0.0 and self.delay_s <= 0.0:
            self._on_taken(request)
            return False
        now = self._loop.now
        taken = now
        if self.seconds > 0.0:
            self._free_at = max(self._free_at, now) + self.seconds
            taken = self._free_at
        self.waiting += 1
        self.waiting_tokens += request.input_length
        self._loop.after(taken + self.delay_s - now, Priority.ARRIVAL, self._taken, request)
        return True

    def busy_until(self) -> float:
        """When the server is through the requests it holds (now if it holds none). The
        same process streams the answers, so a first token the engine produces meanwhile
        reaches the client then: a burst's first tokens come out together, after the
        burst is taken in."""
        return self._free_at if self._free_at > self._loop.now else self._loop.now

    def _taken(self, request: SimRequest) -> None:
        self.waiting -= 1
        self.waiting_tokens -= request.input_length
        self._on_taken(request)

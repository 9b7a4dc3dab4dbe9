"""A network link: processor sharing of bandwidth among transfers, one-way latency RTT/2.

A transfer's bytes drain at an equal share of the (possibly fluctuating) bandwidth
with every other active transfer; once drained, the last byte arrives RTT/2 later.
An isolated transfer of ``b`` bytes therefore takes exactly ``rtt/2 + b/bandwidth``.
A transfer can be cancelled while draining or in flight.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from policies.types import LinkState
from replay.sim.event_loop import EventLoop
from replay.sim.events import Priority
from replay.sim.fluctuation import Fluctuation
from replay.sim.shared_progress import SharedProgress

__all__ = ["Link", "Transfer"]


@dataclass(slots=True, eq=False)
class Transfer:
    """One transfer on a link; ``on_done`` runs when its last byte arrives."""

    key: int
    nbytes: float
    started_s: float
    on_done: Callable[[Transfer], None]
    tag: Any = None
    drained_s: float | None = None
    done_s: float | None = None
    sent_bytes: float = 0.0
    cancelled: bool = False

    @property
    def duration_s(self) -> float | None:
        return None if self.done_s is None else self.done_s - self.started_s


class Link(SharedProgress):
    """Processor-sharing link with RTT and optional bandwidth fluctuation."""

    __slots__ = (
        "_boundary_pending",
        "_fluct",
        "_mult",
        "_next_key",
        "_transfers",
        "bandwidth_bps",
        "bytes_sent",
        "name",
        "rtt_s",
        "state",
        "throughput_rates",
        "throughput_times",
    )

    def __init__(
        self,
        loop: EventLoop,
        name: str,
        bandwidth_bps: float,
        rtt_s: float,
        fluctuation: Fluctuation | None = None,
    ) -> None:
        super().__init__(loop, Priority.LINK)
        self.name = name
        self.bandwidth_bps = bandwidth_bps  # bytes per second
        self.rtt_s = rtt_s
        self.state = LinkState(bandwidth_bps=bandwidth_bps, rtt_s=rtt_s)
        self.bytes_sent = 0.0
        # the aggregate rate as steps: from throughput_times[i], throughput_rates[i] bytes/s
        # (compact arrays: a long run changes rate hundreds of thousands of times)
        self.throughput_times = array("d", [loop.now])
        self.throughput_rates = array("d", [0.0])
        self._fluct = fluctuation
        self._mult = 1.0
        self._boundary_pending = False
        self._transfers: dict[int, Transfer] = {}
        self._next_key = 0

    # -- the process ------------------------------------------------------------------

    def _compute_rate(self) -> float:
        return self.bandwidth_bps * self._mult / len(self._members)

    def _rate_changed(self, rate: float) -> None:
        aggregate = self.bandwidth_bps * self._mult if self._members else 0.0
        if aggregate != self.throughput_rates[-1]:
            self.throughput_times.append(self._loop.now)
            self.throughput_rates.append(aggregate)

    def _completed(self, key: int) -> None:
        transfer = self._transfers[key]
        transfer.drained_s = self._loop.now
        transfer.sent_bytes = transfer.nbytes
        self.bytes_sent += transfer.nbytes
        if self.rtt_s > 0.0:
            self._loop.after(self.rtt_s / 2, Priority.LINK, self._deliver, transfer)
        else:
            self._deliver(transfer)

    def _deliver(self, transfer: Transfer) -> None:
        del self._transfers[transfer.key]
        if transfer.cancelled:
            return
        transfer.done_s = self._loop.now
        transfer.on_done(transfer)

    # -- fluctuation ------------------------------------------------------------------

    def _enter_period(self) -> None:
        fluct = self._fluct
        if fluct is None:
            return
        self._mult = fluct.multiplier(fluct.period(self._loop.now))
        if not self._boundary_pending:
            self._boundary_pending = True
            boundary = (fluct.period(self._loop.now) + 1) * fluct.period_s
            self._loop.at(boundary, Priority.LINK, self._boundary, None)

    def _boundary(self, _: object) -> None:
        self._boundary_pending = False
        self.advance()
        if self._members:
            self._enter_period()
            self.refresh()

    # -- the interface ----------------------------------------------------------------

    def start(
        self, nbytes: float, on_done: Callable[[Transfer], None], tag: Any = None
    ) -> Transfer:
        """Start moving ``nbytes``; ``on_done(transfer)`` when the last byte arrives."""
        self._next_key += 1
        transfer = Transfer(self._next_key, nbytes, self._loop.now, on_done, tag)
        self._transfers[transfer.key] = transfer
        if nbytes <= 0.0:
            transfer.drained_s = self._loop.now
            self._loop.after(self.rtt_s / 2, Priority.LINK, self._deliver, transfer)
            return transfer
        if not self._members:
            self.advance()
            self._enter_period()
        self.add(transfer.key, nbytes)
        return transfer

    def cancel(self, transfer: Transfer) -> None:
        """Stop a transfer: its share goes to the others; ``on_done`` never runs."""
        if transfer.cancelled or transfer.done_s is not None:
            return
        transfer.cancelled = True
        if transfer.key in self._members:
            sent = self.remove(transfer.key)
            transfer.sent_bytes = sent
            self.bytes_sent += sent
            del self._transfers[transfer.key]

    def sync_state(self) -> LinkState:
        """Bring the router-visible state (active transfers, backlog) up to now."""
        self.state.active_transfers = len(self._members)
        self.state.backlog_bytes = self.backlog()
        return self.state

"""The mutable state of one request while the simulator serves it.

A request refers to the instances serving it through two small protocols
(``PrefillServer``, ``DecodeServer``) that ``PrefillInstance`` and ``DecodeInstance``
satisfy, so the instances import the request and not the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Protocol

from policies.admission import Overloaded
from policies.types import Decision, HandoffMode, InstanceLoad, Pipeline
from replay.sim.link import Link, Transfer
from replay.sim.step_costs import StepCosts
from replay.trace.record import TraceRequest

if TYPE_CHECKING:
    from replay.sim.decode_batch import DecodeBatch
    from replay.sim.kv_memory import KvMemory

__all__ = ["DecodeServer", "Leg", "LegState", "PrefillServer", "SimRequest"]


class PrefillServer(Protocol):
    """What a request needs of its P instance (``PrefillInstance``)."""

    @property
    def id(self) -> str: ...

    @property
    def datacenter(self) -> str: ...

    @property
    def cache(self) -> KvMemory:
        """Its KV memory."""

    def submit(self, request: SimRequest) -> None:
        """Queue the request's prefill."""

    def release(self, request: SimRequest) -> None:
        """Unpin the request's blocks: every copy of its KV has left."""


class DecodeServer(Protocol):
    """What a request and its KV copies need of an RLD or MD instance (``DecodeInstance``)."""

    @property
    def id(self) -> str: ...

    @property
    def datacenter(self) -> str: ...

    @property
    def step_costs(self) -> StepCosts: ...

    @property
    def cache(self) -> KvMemory:
        """Its KV memory."""
        ...

    @property
    def load(self) -> InstanceLoad:
        """What the router sees of the instance."""
        ...

    def reserve(self, leg: Leg) -> None:
        """Ask for memory for the copy (the simulator is told when it is granted)."""

    def landed(self, leg: Leg) -> None:
        """The copy's bytes arrived."""

    def arrive(self, leg: Leg) -> None:
        """The request reaches the instance's server (an engine call): it joins the batch
        with what is left of its output once the server has taken it."""

    def join(self, leg: Leg, tokens_left: int) -> None:
        """Start decoding ``tokens_left`` tokens of the request in a batch."""

    def emitted_now(self, request: SimRequest) -> int:
        """Tokens the request has emitted, counting the running batch step's progress."""
        ...

    def leave(self, leg: Leg) -> None:
        """Stop decoding the request (handed off or aborted)."""

    def close(self, leg: Leg) -> None:
        """Free the copy's memory."""


class LegState(IntEnum):
    """Where one KV copy (P to RLD, or P to MD) stands."""

    RESERVING = 0  # waiting for memory on the destination
    SENDING = 1  # memory reserved, bytes on the link
    LANDED = 2  # the KV is on the destination
    CLOSED = 3  # the destination released it (finished, handed off, or aborted)


@dataclass(slots=True, eq=False)
class Leg:
    """One copy of a request's KV from its P instance to a decode instance."""

    request: SimRequest
    dest: DecodeServer
    reuse_cache: bool
    extra_tokens: int  # reserved beyond the chain's blocks: output and block-less prompt
    state: LegState = LegState.RESERVING
    hit_tokens: int = 0
    link: Link | None = None
    transfer: Transfer | None = None
    nbytes: float = 0.0
    running: bool = False  # decoding on dest right now
    queued: bool = False  # landed, waiting for a batch slot on dest
    grown_base: int = 0  # generated tokens dest held when the request (re)started there
    preempted: bool = False  # dest ran out of memory: freed, waiting to be recomputed
    recomputing: bool = False  # re-admitted after a preemption, its context recomputing
    resume_tokens: int = 0  # reserved for the generated tokens being recomputed


class SimRequest:
    """One trace request inside the simulator, from arrival to its last token."""

    __slots__ = (
        "arrival_s",
        "chain",
        "decision",
        "eager_tokens",
        "emitted",
        "finished_on",
        "finished_s",
        "first_token_s",
        "handoff",
        "handoff_gap_s",
        "handoff_rounds",
        "input_length",
        "key",
        "last_lack",
        "last_token_s",
        "max_gap_s",
        "md",
        "md_have",
        "md_leg",
        "md_ready",
        "new_tokens",
        "outgoing",
        "output_length",
        "p",
        "p_hit_tokens",
        "pipeline",
        "preemptions",
        "prefill_end_s",
        "prefill_start_s",
        "private_tokens",
        "reactive",
        "rejected",
        "rld",
        "rld_end_s",
        "rld_leg",
        "rld_start_s",
        "stint_join_s",
        "stint_tokens",
        "tokens_md",
        "tokens_rld",
        "trace",
        "transfer_s",
        "wan_bytes",
    )

    def __init__(self, key: int, trace: TraceRequest, arrival_s: float) -> None:
        self.key = key
        self.trace = trace
        self.arrival_s = arrival_s
        self.chain = trace.hash_ids
        self.input_length = trace.input_length
        self.output_length = max(trace.output_length, 1)
        self.private_tokens = max(trace.input_length - len(trace.hash_ids) * trace.block_size, 0)
        self.decision: Decision | None = None
        self.pipeline: Pipeline = Pipeline.P_MD
        self.p: PrefillServer | None = None
        self.rld: DecodeServer | None = None
        self.md: DecodeServer | None = None
        self.p_hit_tokens = 0
        self.new_tokens = 0
        self.prefill_start_s = 0.0
        self.prefill_end_s = 0.0
        self.outgoing = 0  # legs still holding the KV pinned on P
        self.rld_leg: Leg | None = None
        self.md_leg: Leg | None = None
        self.md_ready = False
        self.handoff: HandoffMode | None = None
        self.md_have = 0  # eager tokens MD has digested (catch-up)
        self.handoff_rounds = 0
        self.last_lack = 0
        self.eager_tokens = 0
        self.handoff_gap_s = 0.0
        self.emitted = 0
        self.tokens_rld = 0
        self.tokens_md = 0
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.max_gap_s = 0.0
        self.stint_join_s = 0.0
        self.stint_tokens = 0
        self.rld_start_s: float | None = None
        self.rld_end_s: float | None = None
        self.finished_s: float | None = None
        self.finished_on: str | None = None
        self.reactive = False
        self.preemptions = 0  # times a decode instance ran out of memory and freed it
        self.rejected: Overloaded | None = None  # refused at arrival (admission control)
        self.wan_bytes = 0.0
        self.transfer_s: float | None = None

    @property
    def finished(self) -> bool:
        return self.finished_s is not None

    def emit(self, tokens: int, last_s: float, *, on_rld: bool) -> None:
        """``tokens`` tokens reach the client, the last at ``last_s``."""
        if self.last_token_s is None:
            self.first_token_s = last_s
        else:
            gap = last_s - self.last_token_s
            if gap > self.max_gap_s:
                self.max_gap_s = gap
            if gap > self.handoff_gap_s:
                self.handoff_gap_s = gap
        self.last_token_s = last_s
        self._count(tokens, on_rld)

    def account_stint(self, tokens: int, last_s: float, gap: float, *, on_rld: bool) -> None:
        """A stint in a decode batch ended: ``tokens`` emitted, the last at ``last_s``,
        ``gap`` the largest step it lived through."""
        if gap > self.max_gap_s:
            self.max_gap_s = gap
        self.last_token_s = last_s
        self._count(tokens, on_rld)

    def emitted_in(self, batch: DecodeBatch) -> int:
        """Tokens emitted by now, counting its progress in ``batch`` (if it is in it)."""
        if self.key not in batch:
            return self.emitted
        done = int(batch.progress_of(self.key) + 1e-9)
        return self.emitted + min(done, self.stint_tokens)

    def stint_done_in(self, batch: DecodeBatch) -> bool:
        """Its stint in ``batch`` has produced its last token by now (its end is due at
        this instant): preempting it would take back tokens already out."""
        return self.key in batch and batch.progress_of(self.key) + 1e-9 >= self.stint_tokens

    def leave_batch(self, batch: DecodeBatch, now: float, *, on_rld: bool) -> None:
        """Stop decoding in ``batch`` before the stint's end (a handoff, a preemption): the
        tokens emitted so far are accounted, the last one at the step it came out."""
        step = batch.step_s()
        progress = batch.leave(self.key)
        gap = batch.gap_at_exit.pop(self.key)
        tokens = min(int(progress + 1e-9), self.stint_tokens)
        if tokens > 0:
            last = max(now - (progress - tokens) * step, self.stint_join_s)
            self.account_stint(tokens, last, gap, on_rld=on_rld)

    def _count(self, tokens: int, on_rld: bool) -> None:
        self.emitted += tokens
        if on_rld:
            self.tokens_rld += tokens
        else:
            self.tokens_md += tokens

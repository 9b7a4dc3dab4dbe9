"""Synthetic agentic traffic: multi-turn tool-using sessions with a skewed prefix hit rate.

The model behind ``AgenticProfile``:

- every prompt starts with one system prompt shared by all sessions (so block 0 and
  the following whole blocks of the system prompt are common to every request);
- sessions arrive as a Poisson process; a session's first request carries the
  system prompt plus a fresh task (so it mostly misses the cache);
- each later turn re-sends the whole context with the previous answer and a tool
  result appended (so it hits everything but the new tail: the high-hit majority);
- a turn resets the context (new task, or compaction when the context would exceed
  ``max_context_tokens``): system prompt plus a fresh summary, a low-hit request;
- some turns fire a side request that reads the current context plus a long fresh
  document and answers briefly: the long-input short-output "odd" traffic;
- turns of a session are separated by think times (generation plus tool run).

Block IDs are what a prefix-chained hash would give: whole blocks of an unchanged
prefix keep their IDs, the block that new tokens complete gets a fresh one, and a
request's partial last block is always fresh. IDs are renumbered by first
appearance in arrival order, as in the Mooncake release.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from replay.trace.record import TraceRequest

__all__ = ["AgenticProfile", "synthesize_agentic"]


class AgenticProfile(BaseModel):
    """Parameters of the synthetic agentic workload (token counts are prompt tokens)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rate: float = Field(
        10.0,
        gt=0,
        description=(
            "Long-run request arrival rate in requests/s (side requests included); "
            "10 rps is about the SLA goodput the paper reports for its PDD cluster "
            "(9-11.5 RPS). Sessions arrive at rate * (1 - odd_share) / turns_mean."
        ),
    )
    block_size: int = Field(512, gt=0, description="Tokens per hash_ids block (Mooncake: 512)")
    system_prompt_tokens: int = Field(
        8000,
        ge=1,
        description="System prompt and tool definitions every request starts with (shared)",
    )
    turns_mean: float = Field(
        30.0, ge=1, description="Mean number of main turns of a session (geometric)"
    )
    first_prompt_median: int = Field(
        10000,
        ge=1,
        description="Median fresh task (instructions, files) a session starts with (log-normal)",
    )
    first_prompt_sigma: float = Field(0.5, ge=0, description="Log-normal sigma of the task")
    tool_result_median: int = Field(
        100, ge=0, description="Median tool result appended to the context each turn"
    )
    tool_result_sigma: float = Field(1.6, ge=0, description="Log-normal sigma of tool results")
    tool_result_max: int = Field(24000, ge=0, description="Cap of one tool result")
    output_median: int = Field(130, ge=1, description="Median answer length of a turn")
    output_sigma: float = Field(0.8, ge=0, description="Log-normal sigma of answer lengths")
    output_max: int = Field(4096, ge=1, description="Cap of one answer")
    think_time_mean_s: float = Field(
        5.0, gt=0, description="Mean time between two turns of a session (generation + tool)"
    )
    think_time_sigma: float = Field(0.8, ge=0, description="Log-normal sigma of think times")
    reset_prob: float = Field(
        0.015, ge=0, le=1, description="Chance that a turn starts a new context (new task)"
    )
    max_context_tokens: int = Field(
        32000,
        ge=1,
        description=(
            "A turn that would exceed it compacts the context (a reset); kept below the "
            "default odd-traffic input threshold (32768) so only side requests are odd"
        ),
    )
    summary_median: int = Field(
        8000, ge=1, description="Median fresh content after a reset (summary or new task)"
    )
    summary_sigma: float = Field(0.5, ge=0, description="Log-normal sigma of that content")
    odd_share: float = Field(
        0.035, ge=0, lt=1, description="Share of requests that are odd side requests"
    )
    odd_input_min: int = Field(36000, ge=1, description="Smallest prompt of a side request")
    odd_input_max: int = Field(
        120000, ge=1, description="Largest prompt of a side request (log-uniform in between)"
    )
    odd_output_min: int = Field(16, ge=1, description="Shortest answer of a side request")
    odd_output_max: int = Field(
        400, ge=1, description="Longest answer of a side request (uniform in between)"
    )
    warm_start: bool = Field(
        True,
        description=(
            "Start with the steady-state number of sessions (their first turns spread over "
            "one mean think time) so the rate holds from t=0 instead of ramping up"
        ),
    )

    @model_validator(mode="after")
    def _ranges(self) -> AgenticProfile:
        if self.odd_input_min > self.odd_input_max:
            raise ValueError("odd_input_min must not exceed odd_input_max")
        if self.odd_output_min > self.odd_output_max:
            raise ValueError("odd_output_min must not exceed odd_output_max")
        return self


@dataclass(slots=True)
class _Context:
    """A prompt as whole-block IDs plus the length of its partial tail."""

    full: list[int]
    tail: int
    length: int


@dataclass(slots=True)
class _Session:
    number: int
    turns_left: int
    context: _Context
    turn: int = 0
    pending: int = 0  # tokens to append before the next turn (answer + tool result)


@dataclass(order=True, slots=True)
class _Event:
    time: float
    seq: int
    session: _Session | None = field(compare=False, default=None)
    ready: TraceRequest | None = field(compare=False, default=None)


class _Generator:
    def __init__(self, profile: AgenticProfile, seed: int) -> None:
        self.p = profile
        self.rng = np.random.default_rng(seed)
        self.next_block = 0
        s = profile.system_prompt_tokens
        self.system = _Context(self._fresh(s // profile.block_size), s % profile.block_size, s)
        self.sessions = 0
        self.seq = 0
        self.heap: list[_Event] = []
        self.main_rate = profile.rate * (1 - profile.odd_share)
        # Side requests follow the main turns systematically (one each time the credit
        # passes 1, from a random phase) so their share is odd_share with little noise.
        self.odd_credit = float(self.rng.random())

    def _fresh(self, n: int) -> list[int]:
        ids = list(range(self.next_block, self.next_block + n))
        self.next_block += n
        return ids

    def _lognormal(self, median: float, sigma: float, low: int, high: int | None = None) -> int:
        value = round(median * math.exp(sigma * float(self.rng.standard_normal())))
        return max(low, value if high is None else min(value, high))

    def _think(self) -> float:
        p = self.p
        if p.think_time_sigma == 0:
            return p.think_time_mean_s
        mu = math.log(p.think_time_mean_s) - p.think_time_sigma**2 / 2
        return float(self.rng.lognormal(mu, p.think_time_sigma))

    def _room(self) -> int:
        """Fresh tokens a new context may hold after the system prompt."""
        return max(1, self.p.max_context_tokens - self.p.system_prompt_tokens)

    def _append(self, ctx: _Context, n: int) -> _Context:
        total = ctx.tail + n
        bs = self.p.block_size
        return _Context(ctx.full + self._fresh(total // bs), total % bs, ctx.length + n)

    def _ids(self, ctx: _Context) -> tuple[int, ...]:
        return tuple(ctx.full + self._fresh(1)) if ctx.tail else tuple(ctx.full)

    def _push(self, time: float, session: _Session | None, ready: TraceRequest | None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, _Event(time, self.seq, session, ready))

    def _new_session(self, time: float) -> None:
        p = self.p
        turns = int(self.rng.geometric(1 / p.turns_mean))
        task = self._lognormal(p.first_prompt_median, p.first_prompt_sigma, 1)
        ctx = self._append(self.system, min(task, self._room()))
        self._push(time, _Session(self.sessions, turns, ctx), None)
        self.sessions += 1

    def _turn(self, time: float, s: _Session) -> TraceRequest:
        p = self.p
        if s.turn > 0:
            reset = self.rng.random() < p.reset_prob
            if reset or s.context.length + s.pending > p.max_context_tokens:
                fresh = self._lognormal(p.summary_median, p.summary_sigma, 1)
                s.context = self._append(self.system, min(fresh, self._room()))
            else:
                s.context = self._append(s.context, s.pending)
        output = self._lognormal(p.output_median, p.output_sigma, 1, p.output_max)
        request = TraceRequest(
            request_id=0,
            arrival_s=time,
            input_length=s.context.length,
            output_length=output,
            hash_ids=self._ids(s.context),
            block_size=p.block_size,
            session_id=str(s.number),
            turn=s.turn,
        )
        tool = self._lognormal(p.tool_result_median, p.tool_result_sigma, 0, p.tool_result_max)
        s.pending = output + tool
        gap = self._think()
        self.odd_credit += p.odd_share / (1 - p.odd_share)
        if self.odd_credit >= 1:
            self.odd_credit -= 1
            self._push(time + gap * float(self.rng.random()), None, self._side(s))
        s.turn += 1
        s.turns_left -= 1
        if s.turns_left > 0:
            self._push(time + gap, s, None)
        return request

    def _side(self, s: _Session) -> TraceRequest:
        p = self.p
        low, high = math.log(p.odd_input_min), math.log(p.odd_input_max)
        target = round(math.exp(float(self.rng.uniform(low, high))))
        ctx = self._append(s.context, max(target - s.context.length, 1))
        output = int(self.rng.integers(p.odd_output_min, p.odd_output_max, endpoint=True))
        return TraceRequest(
            request_id=0,
            arrival_s=0.0,
            input_length=ctx.length,
            output_length=output,
            hash_ids=self._ids(ctx),
            block_size=p.block_size,
            session_id=str(s.number),
            turn=s.turn,
            kind="odd",
        )

    def run(self, requests: int) -> Iterator[TraceRequest]:
        p = self.p
        session_rate = self.main_rate / p.turns_mean
        if p.warm_start:
            active = round(self.main_rate * p.think_time_mean_s)
            starts = np.sort(self.rng.uniform(0, p.think_time_mean_s, size=active))
            for start in starts:
                self._new_session(float(start))
        next_session = float(self.rng.exponential(1 / session_rate))
        renumber: dict[int, int] = {}
        emitted = 0
        while emitted < requests:
            if not self.heap or next_session <= self.heap[0].time:
                self._new_session(next_session)
                next_session += float(self.rng.exponential(1 / session_rate))
                continue
            event = heapq.heappop(self.heap)
            if event.session is not None:
                request = self._turn(event.time, event.session)
            else:
                assert event.ready is not None
                request = event.ready
            ids = tuple(renumber.setdefault(i, len(renumber)) for i in request.hash_ids)
            yield TraceRequest(
                request_id=emitted,
                arrival_s=round(event.time, 3),
                input_length=request.input_length,
                output_length=request.output_length,
                hash_ids=ids,
                block_size=request.block_size,
                session_id=request.session_id,
                turn=request.turn,
                kind=request.kind,
            )
            emitted += 1


def synthesize_agentic(
    profile: AgenticProfile, requests: int, seed: int = 0
) -> Iterator[TraceRequest]:
    """``requests`` requests of the profile's workload in arrival order, from ``seed``."""
    return _Generator(profile, seed).run(requests)

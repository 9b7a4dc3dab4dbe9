"""A replay's trace as a stream: read as the simulation goes, checked request by request.

A trace file is not loaded: ``CheckedTrace`` hands the simulator one request at a time
and on the way measures what the checks and warnings need (``TraceShape``: the largest
prompt and request, whether any request has block IDs), refuses a request no instance
of a pool could hold (the UserError ``check_cluster`` gives), and notices a request
arriving before the previous one (``UnsortedTrace``: the caller then sorts the trace in
memory and starts again, since replays run in arrival order).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from policies.tiers import Tier
from replay.presets.cluster_preset import ClusterPreset
from replay.presets.schema import PoolSpec
from replay.trace.formats import detect_format, open_binary
from replay.trace.record import TraceRequest
from router.errors import UserError

__all__ = [
    "CheckedTrace",
    "TraceShape",
    "UnsortedTrace",
    "capacity_error",
    "count_requests",
    "prompt_tokens",
]


class UnsortedTrace(Exception):
    """A request of a streamed trace arrives before the one read before it."""


def prompt_tokens(request: TraceRequest) -> int:
    """Tokens of the prompt as memory holds them: whole blocks plus any tail without IDs."""
    blocks = len(request.hash_ids) * request.block_size
    return blocks + max(request.input_length - blocks, 0)


@dataclass(slots=True)
class TraceShape:
    """What the cluster checks and the warnings need to know of a whole trace."""

    requests: int = 0
    worst_prompt: int = 0  # the largest prompt, as P's memory holds it
    worst: int = 0  # the largest prompt plus output, as a decode instance's memory holds it
    longest: int = 0  # the largest input plus output length
    has_blocks: bool = False

    def add(self, request: TraceRequest) -> None:
        self.requests += 1
        prompt = prompt_tokens(request)
        if prompt > self.worst_prompt:
            self.worst_prompt = prompt
        total = prompt + max(request.output_length, 1)
        if total > self.worst:
            self.worst = total
        length = request.input_length + request.output_length
        if length > self.longest:
            self.longest = length
        if not self.has_blocks and request.hash_ids:
            self.has_blocks = True

    @classmethod
    def of(cls, requests: Iterable[TraceRequest]) -> TraceShape:
        shape = cls()
        for request in requests:
            shape.add(request)
        return shape


def capacity_error(preset: ClusterPreset, shape: TraceShape, what: str) -> UserError | None:
    """The error for a pool whose instances cannot hold ``shape``'s largest request."""
    for name, pool in preset.pools().items():
        need = shape.worst if _holds_outputs(preset, pool) else shape.worst_prompt
        capacity = preset.kv_capacity_tokens(pool)
        if capacity < need:
            return UserError(
                f"preset {preset.name}: pool {name} holds {capacity} KV tokens per instance, "
                f"less than {what} needs ({need} tokens); "
                "add GPUs per instance or set kv_capacity_tokens"
            )
    return None


def _holds_outputs(preset: ClusterPreset, pool: PoolSpec) -> bool:
    """Whether a request must fit whole (prompt and output) in one of the pool's instances:
    decode pools, and colocated engines that reserve the output at admission (on demand,
    a colocated request too long for the memory overcommits rather than waits)."""
    if pool.tier != Tier.P:
        return True
    return pool.colocated and preset.spec.memory.allocation == "reserve-output"


class CheckedTrace(Iterator[TraceRequest]):
    """The requests of a stream, checked against the cluster's memory as they are read."""

    __slots__ = ("_last", "_preset", "_prompt_cap", "_requests", "_total_cap", "shape")

    def __init__(self, requests: Iterator[TraceRequest], preset: ClusterPreset) -> None:
        self._requests = requests
        self._preset = preset
        self.shape = TraceShape()
        pools = preset.pools().values()
        whole = [_holds_outputs(preset, p) for p in pools]
        p_caps = [preset.kv_capacity_tokens(p) for p, w in zip(pools, whole, strict=True) if not w]
        decode = [preset.kv_capacity_tokens(p) for p, w in zip(pools, whole, strict=True) if w]
        self._prompt_cap = min(p_caps, default=None)
        self._total_cap = min(decode, default=None)
        self._last = float("-inf")

    def __iter__(self) -> CheckedTrace:
        return self

    def __next__(self) -> TraceRequest:
        request = next(self._requests)
        if request.arrival_s < self._last:
            raise UnsortedTrace(request.request_id)
        self._last = request.arrival_s
        shape = self.shape
        shape.add(request)
        prompt_cap, total_cap = self._prompt_cap, self._total_cap
        if (prompt_cap is not None and shape.worst_prompt > prompt_cap) or (
            total_cap is not None and shape.worst > total_cap
        ):
            error = capacity_error(self._preset, shape, "the largest request read so far")
            if error is not None:
                raise error
        return request


def count_requests(path: str | Path, trace_format: str | None = None) -> int:
    """How many requests a trace file holds, counted from its lines without parsing them
    (for a progress bar): non-blank lines, less a CSV header."""
    fmt = trace_format or detect_format(path)
    lines = 0
    with open_binary(Path(path)) as stream:
        for raw in stream:
            if not raw.isspace():
                lines += 1
    return max(lines - 1, 0) if fmt == "azure" else lines

"""In-memory engines for the pipelines' unit tests: each implements the adapter contract
(``engines_adapter.contract.EngineAdapter``) with no socket, and records what it was asked.

An engine's answer is deterministic: the token at position ``n`` of a sequence (prompt
and generated tokens together) is ``TOKEN_BASE + n``, so a client that reads one engine's
tokens and then another's sees a gap or a repeat at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from opentelemetry import trace

from engines_adapter.contract import (
    EngineError,
    EngineLoad,
    GenerateRequest,
    KVEventBatch,
    PrefillResult,
    TokenDelta,
)
from policies.tiers import Tier
from router.service.breaker import CircuitBreakers
from router.service.metrics import ServiceMetrics
from router.service.pipelines.upstream import Upstream
from router.service.pool import InstancePool
from router.service.schemas import InstanceConfig
from router.settings import ClusterSettings

TOKEN_BASE = 1000


def token_at(position: int) -> int:
    return TOKEN_BASE + position


@dataclass
class FakeEngine:
    """One engine; the fields below script its faults, the lists record its calls."""

    instance_id: str
    prefill_error: EngineError | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # prefills wait for it
    fail_after: int | None = None  # generate raises after yielding this many tokens
    generated: list[GenerateRequest] = field(default_factory=list)
    prefilled: list[GenerateRequest] = field(default_factory=list)
    prefills_cancelled: list[str] = field(default_factory=list)
    streams_closed: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ready.set()

    async def prefill(self, request: GenerateRequest, *, targets: int = 1) -> PrefillResult:
        self.prefilled.append(request)
        try:
            await self.ready.wait()
        except asyncio.CancelledError:
            self.prefills_cancelled.append(request.request_id)
            raise
        if self.prefill_error is not None:
            raise self.prefill_error
        params = [{"from": self.instance_id, "target": t} for t in range(targets)]
        first = token_at(len(request.prompt_token_ids))
        return PrefillResult(request_id=request.request_id, first_token_id=first,
                             target_kv_params=params)  # fmt: skip

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[TokenDelta, None]:
        self.generated.append(request)
        start = len(request.prompt_token_ids)
        try:
            for k in range(request.max_tokens):
                if self.fail_after is not None and k >= self.fail_after:
                    raise EngineError(self.instance_id, f"stream broke after {k} tokens")
                await asyncio.sleep(0)  # other tasks (an MD being warmed) run between tokens
                last = k == request.max_tokens - 1
                yield TokenDelta(token_ids=[token_at(start + k)], finished=last,
                                 finish_reason="length" if last else None)  # fmt: skip
        finally:
            self.streams_closed.append(request.request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def load(self) -> EngineLoad:
        return EngineLoad()

    async def health(self) -> bool:
        return True

    async def kv_events(self) -> AsyncGenerator[KVEventBatch, None]:
        raise EngineError(self.instance_id, "no event source")
        yield  # pragma: no cover

    async def aclose(self) -> None:
        return None


@dataclass
class FakeCluster:
    """A pool of fake engines (p0 on P, rld0 on RLD, md0 on MD) and the Upstream over it;
    one failure opens an instance's breaker, so a fault held against it shows."""

    engines: dict[str, FakeEngine]
    pool: InstancePool
    up: Upstream

    @classmethod
    def build(cls, first_token_s: float = 30.0) -> FakeCluster:
        engines = {iid: FakeEngine(iid) for iid in ("p0", "rld0", "md0")}
        pool = InstancePool(ClusterSettings(), lambda cfg: engines[cfg.instance_id],
                            CircuitBreakers(failures_to_open=1))  # fmt: skip
        for iid, tier in (("p0", Tier.P), ("rld0", Tier.RLD), ("md0", Tier.MD)):
            pool.register(InstanceConfig(instance_id=iid, tier=tier, adapter="sim"))
        up = Upstream(pool, ServiceMetrics(), trace.get_tracer("test"),
                      first_token_s=first_token_s, inter_token_s=30.0)  # fmt: skip
        return cls(engines, pool, up)

    def __getitem__(self, instance_id: str) -> FakeEngine:
        return self.engines[instance_id]

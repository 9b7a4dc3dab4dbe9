"""Streams on an instance taken out of service, and engines that answer 429.

A stream under way on an instance whose breaker opens waits at most the grace for its
next token, then fails (the client gets an error event), not at its inter-token
deadline; one still receiving tokens goes on. A 429 is load, never a fault.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from opentelemetry import trace

from engine_sim.engine import SimEngine, SimEngineConfig
from engines_adapter.contract import EngineError, GenerateRequest, TokenDelta
from policies.tiers import Tier
from router.service.breaker import CircuitBreakers
from router.service.metrics import ServiceMetrics
from router.service.orchestrator import Upstream
from router.service.pool import InstancePool
from router.service.schemas import InstanceConfig
from router.settings import ClusterSettings

DECODE_S = 0.005


def _upstream(grace_s: float) -> tuple[Upstream, SimEngine]:
    engine = SimEngine("md0", SimEngineConfig(decode_s_per_token=DECODE_S))
    pool = InstancePool(ClusterSettings(), lambda c: engine)
    pool.register(InstanceConfig(instance_id="md0", tier=Tier.MD, adapter="sim"))
    up = Upstream(pool, ServiceMetrics(), trace.get_tracer("test"), first_token_s=30,
                  inter_token_s=30, ejected_grace_s=grace_s)  # fmt: skip
    return up, engine


def _request(tokens: int) -> GenerateRequest:
    return GenerateRequest(
        request_id="r1", prompt_token_ids=list(range(64)), max_tokens=tokens, ignore_eos=True
    )


async def _drain(stream: AsyncIterator[TokenDelta], limit_s: float) -> None:
    async with asyncio.timeout(limit_s):
        async for _ in stream:
            pass


async def _eject_after(up: Upstream, delay_s: float) -> None:
    await asyncio.sleep(delay_s)
    up.pool.health.failed("md0", unreachable=True)  # the breaker opens


async def test_a_hung_stream_ends_a_grace_after_its_instance_is_taken_out() -> None:
    up, engine = _upstream(grace_s=0.2)
    stream = up.generate("md0", _request(1000), None)
    for _ in range(5):
        await anext(stream)
    engine.faults.hang = True  # the next tokens never come
    loop = asyncio.get_running_loop()
    start = loop.time()
    ejecting = asyncio.create_task(_eject_after(up, 0.1))
    with pytest.raises(EngineError, match="taken out of service") as ended:
        await _drain(stream, 10)  # bounded: its own inter-token deadline is 30 s
    elapsed = loop.time() - start
    await ejecting
    assert 0.25 <= elapsed < 1.5  # 0.1 s to the ejection, then the 0.2 s grace
    assert "token after 5" in str(ended.value)


async def test_a_stream_still_receiving_tokens_goes_on_after_its_instance_is_taken_out() -> None:
    up, _ = _upstream(grace_s=0.2)
    got = 0
    ejecting = asyncio.create_task(_eject_after(up, 0.05))
    async with asyncio.timeout(10):
        async for delta in up.generate("md0", _request(200), None):
            got += len(delta.token_ids)
    await ejecting
    assert up.pool.health.ejected("md0")
    assert got == 200  # every token, each well within the grace


async def test_a_stream_on_an_instance_already_out_waits_only_the_grace() -> None:
    up, engine = _upstream(grace_s=0.1)
    stream = up.generate("md0", _request(1000), None)
    await anext(stream)
    up.pool.health.failed("md0", unreachable=True)
    engine.faults.hang = True
    with pytest.raises(EngineError, match="taken out of service"):
        await _drain(stream, 5)


def test_a_busy_answer_counts_as_load_and_never_opens_the_breaker() -> None:
    breakers = CircuitBreakers(failures_to_open=1)
    pool = InstancePool(ClusterSettings(), lambda c: SimEngine(c.instance_id), breakers)
    pool.register(InstanceConfig(instance_id="md0", tier=Tier.MD, adapter="sim"))
    up = Upstream(pool, ServiceMetrics(), trace.get_tracer("test"))
    for _ in range(4):
        up._failed("md0", EngineError("md0", "generate: HTTP 429: busy", cause="busy"))
    assert not pool.health.ejected("md0")
    assert pool.loads["md0"].queued == 4  # four more queued there, as far as we know
    pool.reported("md0", running=1, waiting=0, kv_used=0)  # until the engine reports
    assert pool.loads["md0"].queued == 0
    up._failed("md0", EngineError("md0", "generate: HTTP 503: down"))
    assert pool.health.ejected("md0")  # a fault still counts (one opens it here)

"""Two router replicas on the real Redis: a request one of them has admitted counts in the
other's next decision, however late the first replica's own bookkeeping runs.

Both services run in this process (lifespans by hand, requests through ASGI), in front of
engines whose prefill waits for the test: a request stays admitted and in prefill while the
other replica decides, so which P it picks is the point, not a question of timing. Three
idle P instances: a second request that sees the first one's prefill goes to another P; one
that does not sees every P idle and takes p0, as the first did.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from engine_sim.engine import SimEngine, SimEngineConfig
from engines_adapter.contract import GenerateRequest, PrefillResult
from router.service.app import create_app
from router.service.schemas import InstanceConfig
from router.service.state import ServiceState
from router.settings import Settings
from tests.contract.conftest import delete_prefix, require_redis, unique_prefix

pytestmark = pytest.mark.redis

VOCAB = 512
PROMPT = [(7 * i + 3) % VOCAB for i in range(512)]
INSTANCES = """\
- {instance_id: p0, tier: p, datacenter: A, adapter: sim}
- {instance_id: p1, tier: p, datacenter: A, adapter: sim}
- {instance_id: p2, tier: p, datacenter: A, adapter: sim}
- {instance_id: md0, tier: md, datacenter: B, adapter: sim}
"""
WAIT_S = 20.0  # bound on every wait: a hang fails the test, it never blocks the run


@dataclass
class Gate:
    """Prefills announce themselves (instance ids, in order) and wait for ``open``."""

    open: asyncio.Event = field(default_factory=asyncio.Event)
    entered: asyncio.Queue[str] = field(default_factory=asyncio.Queue)

    def engines(self) -> Callable[[InstanceConfig, httpx.AsyncClient], SimEngine]:
        gate = self

        class Gated(SimEngine):
            async def prefill(self, request: GenerateRequest, *, targets: int = 1) -> PrefillResult:
                gate.entered.put_nowait(self.instance_id)
                await gate.open.wait()
                return await super().prefill(request, targets=targets)

        def build(config: InstanceConfig, _: httpx.AsyncClient) -> SimEngine:
            return Gated(config.instance_id, SimEngineConfig(vocab_size=VOCAB))

        return build

    async def next_prefill(self) -> str:
        return await asyncio.wait_for(self.entered.get(), WAIT_S)


@dataclass
class Replica:
    client: httpx.AsyncClient
    svc: ServiceState

    def send(self, tail: int) -> asyncio.Task[httpx.Response]:
        body = {"prompt": [*PROMPT, tail], "max_tokens": 2, "ignore_eos": True}
        return asyncio.create_task(self.client.post("/v1/completions", json=body))

    async def heartbeat(self) -> None:
        assert self.svc.peers is not None
        await self.svc.lane.run(self.svc.peers.heartbeat)


@contextlib.asynccontextmanager
async def replica(settings: Settings, gate: Gate) -> AsyncIterator[Replica]:
    app: FastAPI = create_app(settings, adapter_factory=gate.engines())
    async with app.router.lifespan_context(app) as state:

        async def with_state(scope: Scope, receive: Receive, send: Send) -> None:
            scope["state"] = dict(state or {})
            await app(scope, receive, send)

        transport = httpx.ASGITransport(app=with_state)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://router", timeout=WAIT_S
        ) as client:
            yield Replica(client, (state or {})["svc"])


@pytest.fixture
def settings(tmp_path: Path) -> Iterator[Settings]:
    url = require_redis()
    prefix = unique_prefix()
    instances = tmp_path / "instances.yaml"
    instances.write_text(INSTANCES)
    # heartbeats far apart: no exchange but the ones each test makes happens meanwhile
    yield Settings(
        index={"backend": "redis"},
        redis={"url": url, "key_prefix": prefix},
        replicas={"share": True, "ttl_s": 120, "heartbeat_s": 60},
        service={"vocab_size": VOCAB, "instances_file": str(instances)},
        policy={"name": "pdd", "params": {"wan_budget_s": 1e6}},  # P-MD only
    )
    client = redis.Redis.from_url(url)
    try:
        delete_prefix(client, prefix)
    finally:
        client.close()


async def served(task: asyncio.Task[httpx.Response]) -> str:
    response = await asyncio.wait_for(task, WAIT_S)
    assert response.status_code == 200, response.text
    p: str = response.json()["pdd"]["instances"]["p"]
    return p


async def test_a_replica_that_has_not_heard_of_the_other_yet_counts_its_requests(
    settings: Settings,
) -> None:
    """A starts alone; B starts and sees A, but A has not yet heard of B (its next
    heartbeat is far off), as right after two replicas start together. A request admitted
    through A is still in prefill when B decides, and the other way round."""
    gate = Gate()
    async with replica(settings, gate) as a, replica(settings, gate) as b:
        assert a.svc.peers is not None
        assert b.svc.peers is not None
        assert (a.svc.peers.replicas, b.svc.peers.replicas) == (1, 2)
        first = a.send(1)
        assert await gate.next_prefill() == "p0"
        second = b.send(2)
        assert await gate.next_prefill() == "p1"  # p0 is busy with A's prefill
        third = a.send(3)
        assert await gate.next_prefill() == "p2"  # A counts B's request too
        gate.open.set()
        assert [await served(t) for t in (first, second, third)] == ["p0", "p1", "p2"]


async def test_a_replica_admitted_request_counts_before_the_replica_publishes_again(
    settings: Settings,
) -> None:
    """Both replicas have heard each other. A admits a request and then does nothing on
    its index lane for a while (a busy machine: its thread does not run), so whatever A
    would publish after its decision waits; B, deciding on a view older than A's decision,
    must still count that request."""
    gate = Gate()
    async with replica(settings, gate) as a, replica(settings, gate) as b:
        await a.heartbeat()
        await b.heartbeat()
        assert a.svc.peers is not None
        assert b.svc.peers is not None
        assert (a.svc.peers.replicas, b.svc.peers.replicas) == (2, 2)
        lane_free = threading.Event()
        decide = a.svc.decider.scheduler.decide

        def decide_then_stall(*args: Any, **kwargs: Any) -> Any:
            decision = decide(*args, **kwargs)
            a.svc.lane.submit(lane_free.wait, WAIT_S)  # A's next lane work waits behind
            return decision

        a.svc.decider.scheduler.decide = decide_then_stall  # type: ignore[method-assign]
        try:
            first = a.send(1)
            assert await gate.next_prefill() == "p0"
            second = b.send(2)
            assert await gate.next_prefill() == "p1"  # not p0: A's request is in prefill
        finally:
            lane_free.set()
        gate.open.set()
        assert [await served(t) for t in (first, second)] == ["p0", "p1"]
        # once both have their first token, nothing of theirs is left claimed or in flight
        await a.heartbeat()
        await b.heartbeat()
        for r in (a, b):
            assert {
                iid: load for iid, load in r.svc.pool.own_load().items() if load != (0, 0)
            } == {}

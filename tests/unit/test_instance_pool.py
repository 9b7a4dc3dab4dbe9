"""The pool's load: what engines report, combined with what the router has in flight."""

from __future__ import annotations

import asyncio

from engine_sim.engine import SimEngine, SimEngineConfig
from policies.tiers import Tier
from policies.types import Decision, Pipeline
from router.service.pool import InstancePool
from router.service.schemas import InstanceConfig
from router.settings import ClusterSettings


def pool_with(*specs: tuple[str, Tier]) -> InstancePool:
    pool = InstancePool(
        ClusterSettings(),
        lambda c: SimEngine(c.instance_id, SimEngineConfig()),
    )
    for iid, tier in specs:
        pool.register(InstanceConfig(instance_id=iid, tier=tier, adapter="sim"))
    return pool


def test_running_is_the_larger_of_the_report_and_the_routers_open_streams() -> None:
    pool = pool_with(("md0", Tier.MD))
    load = pool.loads["md0"]
    pool.stream_started("md0")
    pool.stream_started("md0")
    assert load.running == 2  # the engine has not reported them yet
    pool.reported("md0", running=5, waiting=3, kv_used=1000)
    assert (load.running, load.queued, load.kv_used_tokens) == (5, 3, 1000)
    pool.reported("md0", running=0, waiting=0, kv_used=0)  # a stale gauge
    assert load.running == 2
    pool.stream_started("md0", -1)
    pool.stream_started("md0", -1)
    pool.stream_started("md0", -1)  # never below zero
    assert load.running == 0
    assert load.occupancy == 0.0


def test_prefill_tokens_in_flight_are_the_prefill_queue() -> None:
    pool = pool_with(("p0", Tier.P), ("p1", Tier.P))
    pool.prefill_started("p0", 3000)
    pool.prefill_started("p0", 500)
    assert pool.loads["p0"].queued_prefill_tokens == 3500
    assert pool.loads["p1"].queued_prefill_tokens == 0
    pool.prefill_started("p0", -3000)
    assert pool.loads["p0"].queued_prefill_tokens == 500
    pool.remove("p0")
    pool.prefill_started("p0", 100)  # an instance removed meanwhile is ignored
    assert "p0" not in pool.loads


async def test_a_wait_on_an_instance_ends_when_its_breaker_opens_and_not_before() -> None:
    pool = pool_with(("md0", Tier.MD), ("md1", Tier.MD))

    async def wait_on(instance_id: str) -> None:
        async with asyncio.timeout(30) as deadline:
            with pool.health.until_ejected(instance_id, deadline):
                await asyncio.sleep(60)  # an engine that never answers

    waiting = asyncio.create_task(wait_on("md0"))
    await asyncio.sleep(0.05)
    pool.health.failed("md1", unreachable=True)  # another instance's ejection changes nothing
    await asyncio.sleep(0.05)
    assert not waiting.done()
    pool.health.failed("md0", unreachable=True)  # md0's breaker opens
    done, _ = await asyncio.wait({waiting}, timeout=5)
    assert waiting in done  # at once, not after its 30 s
    assert isinstance(waiting.exception(), TimeoutError)
    assert pool.health.ejected("md0")
    assert pool.health.ejected("md1")


async def test_a_wait_on_an_instance_already_out_of_service_ends_at_once() -> None:
    pool = pool_with(("md0", Tier.MD))
    pool.health.failed("md0", unreachable=True)
    cut = None
    async with asyncio.timeout(5):  # bounded: the wait's own deadline is 30 s
        try:
            async with asyncio.timeout(30) as deadline:
                with pool.health.until_ejected("md0", deadline) as watch:
                    await asyncio.sleep(60)
        except TimeoutError:
            cut = watch.cut
    assert cut is True


async def test_deadlines_expiring_together_survive_the_breaker_opening_among_them() -> None:
    """Six calls time out in the same loop iteration; the third failure opens the breaker
    while the others' deadlines are already expiring: none is touched, none errs."""
    pool = pool_with(("md0", Tier.MD))
    started = asyncio.Barrier(6)
    when: list[float] = []

    async def call() -> bool:
        try:
            async with asyncio.timeout(None) as deadline:
                with pool.health.until_ejected("md0", deadline) as watch:
                    # one absolute deadline for all six, set once all are watching: on a
                    # busy machine, relative deadlines set as each call starts would expire
                    # in different iterations and the breaker would rightly cut the later
                    await started.wait()
                    when.append(when[0] if when else asyncio.get_running_loop().time() + 0.01)
                    deadline.reschedule(when[0])
                    await asyncio.sleep(10)
        except TimeoutError:
            pool.health.failed("md0")
        return watch.cut

    cuts = await asyncio.wait_for(asyncio.gather(*(call() for _ in range(6))), 5)
    assert cuts == [False] * 6  # each ended by its own deadline
    assert pool.health.ejected("md0")


def _decision(pipeline: Pipeline, **instances: str) -> Decision:
    return Decision(policy="test", pipeline=pipeline, predicted_hit={Tier.P: 0.25}, **instances)


def test_a_decisions_work_counts_from_the_decision_and_once_its_engine_calls_start() -> None:
    pool = pool_with(("p0", Tier.P), ("p1", Tier.P), ("md0", Tier.MD))
    pool.claim("r1", _decision(Pipeline.P_MD, p_instance="p0", md_instance="md0"), 4000)
    # 3,000 of the 4,000 prompt tokens are expected uncached on p0; MD gets a stream
    assert pool.loads["p0"].queued_prefill_tokens == 3000
    assert pool.loads["md0"].running == 1
    assert pool.own_load() == {"p0": (0, 3000), "p1": (0, 0), "md0": (1, 0)}
    pool.prefill_started("p0", 3000)  # the orchestrator's prefill takes the claim's place
    assert pool.loads["p0"].queued_prefill_tokens == 3000
    pool.prefill_started("p0", -3000)
    assert pool.loads["p0"].queued_prefill_tokens == 0
    pool.stream_started("md0")
    assert pool.loads["md0"].running == 1
    pool.release("r1")  # the first token: nothing was left of the claim
    assert pool.loads["md0"].running == 1
    pool.stream_started("md0", -1)
    assert pool.own_load() == {"p0": (0, 0), "p1": (0, 0), "md0": (0, 0)}


def test_a_claim_whose_engine_calls_never_start_is_dropped_on_release() -> None:
    pool = pool_with(("p0", Tier.P), ("rld0", Tier.RLD), ("md0", Tier.MD))
    decision = _decision(Pipeline.P_RLD_MD, p_instance="p0", rld_instance="rld0",
                         md_instance="md0")  # fmt: skip
    pool.claim("r1", decision, 1000)
    pool.claim("r2", _decision(Pipeline.COLOCATED, p_instance="p0"), 1000)
    assert pool.own_load() == {"p0": (1, 1500), "rld0": (1, 0), "md0": (1, 0)}
    pool.prefill_started("p0", 750)  # one of them reached the engine
    assert pool.loads["p0"].queued_prefill_tokens == 1500
    pool.release("r1")  # the engine failed before the first token
    pool.release("r2")
    assert pool.loads["p0"].queued_prefill_tokens == 750  # only the call that started
    assert (pool.loads["rld0"].running, pool.loads["md0"].running) == (0, 0)
    assert pool.own_load() == {"p0": (0, 750), "rld0": (0, 0), "md0": (0, 0)}


def test_a_decode_instances_step_is_its_inter_token_gaps_between_two_polls() -> None:
    pool = pool_with(("md0", Tier.MD))
    load = pool.loads["md0"]
    pool.reported("md0", running=4, waiting=0, kv_used=0, itl=(120.0, 4000.0))
    assert load.step_s == 0.0  # the first poll's totals span the engine's whole life
    pool.reported("md0", running=4, waiting=0, kv_used=0, itl=(129.0, 4100.0))
    assert load.step_s == 0.09  # 9 s over 100 gaps since the last poll
    pool.reported("md0", running=0, waiting=0, kv_used=0, itl=(129.0, 4100.0))
    assert load.step_s == 0.09  # nothing decoded meanwhile: the last step stands
    pool.reported("md0", running=1, waiting=0, kv_used=0, itl=(1.0, 10.0))  # restarted
    assert load.step_s == 0.09
    pool.reported("md0", running=1, waiting=0, kv_used=0, itl=(1.5, 20.0))
    assert load.step_s == 0.05
    fresh = pool_with(("md1", Tier.MD))  # an engine polled before its first token
    fresh.reported("md1", running=0, waiting=0, kv_used=0)
    fresh.reported("md1", running=1, waiting=0, kv_used=0, itl=(0.3, 10.0))
    assert fresh.loads["md1"].step_s == 0.03


def test_streams_the_engine_reports_waiting_count_once() -> None:
    """The router's open streams are the engine's running and waiting requests together:
    counting them as running and the waiting again would make a busy engine look fuller
    than it is (occupancy, a full MD's slot wait)."""
    pool = pool_with(("md0", Tier.MD))
    load = pool.loads["md0"]
    for _ in range(12):
        pool.stream_started("md0")
    pool.reported("md0", running=8, waiting=4, kv_used=0)
    assert (load.running, load.queued) == (8, 4)
    pool.stream_started("md0")  # a new one the engine has not reported yet
    assert (load.running, load.queued) == (9, 4)

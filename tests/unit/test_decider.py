"""The service's decision part on its own: what it claims in the pool, the instances it
leaves out, and what the client is told when nothing can serve it."""

from __future__ import annotations

import pytest
from fake_engines import FakeCluster
from opentelemetry import trace

from policies.admission import Bottleneck, Overloaded
from policies.tiers import Tier
from policies.types import ClusterView, Decision, Matches, Pipeline, RequestView
from router.index.memory_index import MemoryPrefixIndex
from router.scheduler_factory import SchedulerFactory
from router.service import decide as decide_module
from router.service.decide import Decider
from router.service.errors import ApiError
from router.service.experiments import Experiments
from router.service.index_lane import IndexLane
from router.service.metrics import ServiceMetrics
from router.service.schemas import InstanceConfig


class Scripted:
    """A policy that sends P-MD to the first P and MD instances it is shown, or refuses
    with ``refusal``; it records the instances it was shown."""

    name = "scripted"

    def __init__(self) -> None:
        self.refusal: Overloaded | None = None
        self.shown: list[list[str]] = []

    def decide(self, request: RequestView, cluster: ClusterView, matches: Matches) -> Decision:
        ids = [i.instance_id for pool in cluster.instances.values() for i in pool if i.healthy]
        self.shown.append(sorted(ids))
        if self.refusal is not None:
            raise self.refusal
        p = [i for i in ids if i.startswith("p")]
        md = [i for i in ids if i.startswith("md")]
        if not p or not md:
            raise LookupError("no healthy P or MD instance")  # as the real policies say
        return Decision(
            policy=self.name, pipeline=Pipeline.P_MD, p_instance=p[0], md_instance=md[0]
        )


def _decider() -> tuple[Decider, Scripted, FakeCluster]:
    cluster = FakeCluster.build()
    policy = Scripted()
    schedulers = SchedulerFactory.create(MemoryPrefixIndex())
    scheduler = schedulers.build(policy)
    decider = Decider(cluster.pool, scheduler, Experiments(schedulers), IndexLane(threaded=False),
                      trace.get_tracer("test"), ServiceMetrics())  # fmt: skip
    return decider, policy, cluster


def _view(request_id: str = "r1") -> RequestView:
    return RequestView(chain=(1, 2, 3), block_size=16, input_length=48, max_tokens=8,
                       request_id=request_id)  # fmt: skip


async def test_an_admitted_decision_counts_in_the_pool_until_released() -> None:
    decider, _, cluster = _decider()
    decision, arm = await decider.decide(_view(), admit=True)
    assert (decision.p_instance, decision.md_instance, arm) == ("p0", "md0", None)
    assert cluster.pool.own_load()["p0"][1] > 0  # the prompt claimed on P's prefill queue
    assert cluster.pool.own_load()["md0"][0] == 1  # a stream claimed on MD
    cluster.pool.release("r1")
    assert cluster.pool.own_load()["p0"] == (0, 0)
    assert cluster.pool.own_load()["md0"] == (0, 0)


async def test_a_decision_only_asked_for_claims_nothing() -> None:
    decider, _, cluster = _decider()
    await decider.decide(_view())
    assert set(cluster.pool.own_load().values()) == {(0, 0)}


async def test_instances_the_request_failed_on_are_left_out() -> None:
    decider, policy, _ = _decider()
    await decider.decide(_view(), exclude={"rld0"}, admit=True)
    assert policy.shown == [["md0", "p0"]]


async def test_nothing_left_to_route_to_is_a_503_naming_why() -> None:
    decider, _, _ = _decider()
    with pytest.raises(ApiError) as refused:
        await decider.decide(_view(), exclude={"md0"})
    assert refused.value.status == 503
    assert refused.value.message == "cannot route: no healthy P or MD instance"
    assert refused.value.headers == {"Retry-After": "1"}


async def test_an_overloaded_cluster_is_a_429_with_retry_after_and_bottleneck() -> None:
    decider, policy, _ = _decider()
    policy.refusal = Overloaded("scripted", Bottleneck.PREFILL, 2.4, "prefill queue 9 s")
    with pytest.raises(ApiError) as refused:
        await decider.decide(_view(), admit=True)
    assert (refused.value.status, refused.value.code) == (429, "overloaded")
    assert refused.value.headers == {"Retry-After": "3", "x-pdd-bottleneck": "prefill"}
    assert "prefill queue 9 s" in refused.value.message


async def test_a_request_too_long_even_for_an_idle_cluster_is_a_400() -> None:
    decider, policy, _ = _decider()
    policy.refusal = Overloaded("scripted", Bottleneck.PREFILL, 1.0, "slow", alone_s=4.5)
    with pytest.raises(ApiError) as refused:
        await decider.decide(_view(), admit=True)
    assert (refused.value.status, refused.value.code) == (400, "first_token_limit")
    assert "4.50s" in refused.value.message


async def test_busy_instances_are_tried_again_when_nothing_else_can_serve(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(decide_module, "BUSY_BACKOFF_S", 0.0)
    decider, policy, _ = _decider()
    busy = {"md0"}
    decision, _ = await decider.decide_around(_view(), set(), busy)
    assert decision.md_instance == "md0"
    assert busy == set()  # emptied: they were asked again
    assert policy.shown[-1] == ["md0", "p0", "rld0"]


async def test_busy_instances_are_avoided_while_another_can_serve() -> None:
    decider, _, cluster = _decider()
    cluster.engines["md1"] = cluster.engines["md0"]
    cluster.pool.register(InstanceConfig(instance_id="md1", tier=Tier.MD, adapter="sim"))
    busy = {"md0"}
    decision, _ = await decider.decide_around(_view(), set(), busy)
    assert decision.md_instance == "md1"
    assert busy == {"md0"}

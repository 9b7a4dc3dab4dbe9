"""The outage-tolerant index: a Redis that restarts empty or a broken log never wedges it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import fakeredis
import pytest
import redis

from policies.tiers import Tier
from router.index.base import IndexedInstance, UnknownInstanceError
from router.index.memory_index import MemoryPrefixIndex
from router.index.redis_index import RedisPrefixIndex
from router.index.resilient_index import ResilientIndex

PREFIX = "pdd-unit"
A = tuple(range(1, 41))  # a 40-block chain
B = (*A[:10], *range(101, 121))  # shares its first 10 blocks with A


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def shared(server: fakeredis.FakeServer, **kwargs: Any) -> RedisPrefixIndex:
    client = fakeredis.FakeRedis(server=server)
    return RedisPrefixIndex("redis://fake.invalid/0", key_prefix=PREFIX, client=client, **kwargs)


def resilient(server: fakeredis.FakeServer, clock: Clock, **kwargs: Any) -> ResilientIndex:
    return ResilientIndex(shared(server), clock=clock, retry_after_s=1.0, **kwargs)


def settle(index: ResilientIndex, limit: int = 50) -> int:
    """Calls of ``check`` until the index is up again; fails past ``limit``."""
    for calls in range(1, limit + 1):
        if not index.check():
            return calls
    raise AssertionError(f"still {index.state} after {limit} checks: {index.stats}")


def restart_empty(server: fakeredis.FakeServer) -> None:
    server.connected = True
    fakeredis.FakeRedis(server=server).flushall()


@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


def populated(server: fakeredis.FakeServer, clock: Clock, **kwargs: Any) -> ResilientIndex:
    index = resilient(server, clock, **kwargs)
    index.register(IndexedInstance("p0", Tier.P, "A"))
    index.register(IndexedInstance("md0", Tier.MD, "B"))
    index.store("p0", A)
    index.store("md0", A)
    index.store("md0", B)
    return index


def test_an_empty_restart_found_by_a_store_is_rebuilt_and_the_store_kept(
    server: fakeredis.FakeServer,
) -> None:
    clock = Clock()
    index = populated(server, clock)
    restart_empty(server)  # the connection just reconnects: no outage is ever seen
    index.store("md0", (*A, 41, 42))  # the shared index answers "unknown instance"
    settle(index)
    other = shared(server)
    assert [i.instance_id for i in other.instances()] == ["md0", "p0"]
    assert other.match((*A, 41, 42, 43)) == {"md0": 42, "p0": 40}
    assert other.match(B) == {"md0": 30, "p0": 10}
    assert index.stats.rebuilds == 1


def test_a_match_after_an_empty_restart_is_answered_from_the_mirror(
    server: fakeredis.FakeServer,
) -> None:
    clock = Clock()
    index = populated(server, clock)
    assert index.match(B) == {"md0": 30, "p0": 10}
    assert index.stats.rebuilds == 0  # every instance answered: nothing was lost
    restart_empty(server)
    assert index.match(B) == {"md0": 30, "p0": 10}  # not the empty shared answer
    assert index.degraded
    settle(index)
    assert shared(server).match(B) == {"md0": 30, "p0": 10}
    assert shared(server).num_blocks("md0") == 60  # A and B share 10 blocks


def test_updates_queued_for_a_redis_that_returns_empty_do_not_wedge_the_log(
    server: fakeredis.FakeServer,
) -> None:
    clock = Clock()
    index = populated(server, clock)
    server.connected = False  # Redis dies
    assert index.match(A) == {"md0": 40, "p0": 40}
    assert index.state == "down"
    index.store("md0", (*A, 41))  # queued
    index.remove("p0", A[30:])  # queued
    restart_empty(server)
    clock.now += 2.0  # past the retry delay
    assert index.match((*A, 41)) == {"md0": 41, "p0": 30}
    settle(index)
    assert shared(server).match((*A, 41)) == {"md0": 41, "p0": 30}
    assert index.stats.superseded_updates == 2  # the rebuild wrote the mirror instead
    assert index.stats.rebuilds == 1


class Flaky:
    """A primary without a generation token that can be made unreachable."""

    def __init__(self, inner: MemoryPrefixIndex) -> None:
        self.inner = inner
        self.down = False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                raise redis.ConnectionError("refused")
            return attr(*args, **kwargs)

        return call


def test_a_queued_update_the_shared_index_refuses_is_dropped_counted_and_rebuilt() -> None:
    clock = Clock()
    primary = Flaky(MemoryPrefixIndex())
    index = ResilientIndex(primary, clock=clock, retry_after_s=1.0)
    index.register(IndexedInstance("md0", Tier.MD, "B"))
    index.store("md0", A)
    primary.down = True
    index.store("md0", B)  # queued
    primary.down = False
    primary.inner.unregister("md0")  # e.g. another replica removed it meanwhile
    clock.now += 2.0
    assert index.match(B) == {"md0": 30}
    settle(index)
    assert index.stats.failed_updates == 1
    assert primary.inner.match(B) == {"md0": 30}  # registered again, blocks written back
    assert primary.inner.match(A) == {"md0": 40}


def test_a_full_log_is_replaced_by_a_rebuild_that_keeps_removals(
    server: fakeredis.FakeServer,
) -> None:
    clock = Clock()
    index = populated(server, clock, max_pending=3)
    server.connected = False
    index.match(A)
    index.remove("md0", A[35:])  # an eviction the shared index must not keep
    for k in range(4):
        index.store("p0", (*A, 1000 + k))
    server.connected = True  # back with its data, which now lacks the last updates
    clock.now += 2.0
    settle(index)
    assert index.stats.overflowed_updates == 1
    assert shared(server).match(A) == {"md0": 35, "p0": 40}
    assert shared(server).match((*A, 1003)) == {"md0": 35, "p0": 41}


def test_the_rebuild_keeps_the_lru_order_leaves_are_evicted_first(
    server: fakeredis.FakeServer,
) -> None:
    clock = Clock()
    index = resilient(server, clock)
    index.register(IndexedInstance("md0", Tier.MD, "B", capacity_blocks=6))
    index.store("md0", (1, 2, 3))
    index.store("md0", (11, 12, 13))
    restart_empty(server)
    index.match((1, 2, 3))
    settle(index)
    client = fakeredis.FakeRedis(server=server)
    scores = [client.zscore(f"{PREFIX}:lru:md0", f"{b:016x}") for b in (1, 2, 3, 11, 12, 13)]
    ranks = [float(r) for r in scores if r is not None]
    assert len(ranks) == 6
    # parents more recent than their children, the older chain below the newer one
    assert ranks[2] < ranks[1] < ranks[0] < ranks[5] < ranks[4] < ranks[3]
    index.store("md0", (21,))  # one over capacity: the older chain's leaf goes first
    assert shared(server).match((1, 2, 3)) == {"md0": 2}
    assert shared(server).match((11, 12, 13)) == {"md0": 3}


def test_a_large_rebuild_runs_in_bounded_steps_while_the_mirror_answers(
    server: fakeredis.FakeServer,
) -> None:
    clock = Clock()
    index = resilient(server, clock, batch_blocks=4, step_s=0.0)  # 16 blocks per call
    index.register(IndexedInstance("md0", Tier.MD, "B"))
    chains = [tuple(range(1000 * k, 1000 * k + 40)) for k in range(1, 11)]
    for chain in chains:
        index.store("md0", chain)
    restart_empty(server)
    calls = 0
    while index.degraded or calls == 0:
        chain = chains[calls % len(chains)]
        assert index.match(chain) == {"md0": 40}
        calls += 1
        assert calls < 40
    assert calls >= 400 // 16
    other = shared(server)
    assert all(other.match(chain) == {"md0": 40} for chain in chains)
    assert index.stats.rebuilt_blocks == 400


def test_a_replica_notices_another_replica_refilled_a_restarted_redis(
    server: fakeredis.FakeServer,
) -> None:
    clock = Clock()
    first = resilient(server, clock, verify_every_s=1.0)
    second = resilient(server, clock, verify_every_s=1.0)
    for index in (first, second):
        index.register(IndexedInstance("md0", Tier.MD, "B"))
    first.store("md0", A)
    second.store("md0", B)  # only the second replica saw these
    restart_empty(server)
    first.store("md0", (*A, 41))
    settle(first)
    assert shared(server).match(B) == {"md0": 10}
    clock.now += 2.0  # the second replica's next verification
    second.match(B)  # the instance is registered again: only the generation tells
    settle(second)
    assert shared(server).match(B) == {"md0": 30}
    assert shared(server).match((*A, 41)) == {"md0": 41}


def test_every_change_of_state_reaches_the_callback(server: fakeredis.FakeServer) -> None:
    clock = Clock()
    seen: list[bool] = []
    index = populated(server, clock, on_state_change=seen.append, batch_blocks=4, step_s=0.0)
    assert seen == []
    server.connected = False
    index.match(A)
    index.match(A)
    assert seen == [True]
    restart_empty(server)
    clock.now += 2.0
    settle(index)
    assert seen == [True, False]
    restart_empty(server)
    index.check()  # a probe finds the new generation at once
    assert seen == [True, False, True]
    settle(index)
    assert seen == [True, False, True, False]


def test_forcing_degraded_acts_as_an_outage_until_the_retry_delay(
    server: fakeredis.FakeServer,
) -> None:
    clock = Clock()
    index = populated(server, clock)
    index.degraded = True
    assert index.check() is True  # the retry delay has not passed
    assert index.match(A) == {"md0": 40, "p0": 40}
    clock.now += 2.0
    assert index.check() is False
    assert index.stats.replayed_updates == 0  # nothing was queued: nothing to replay


class Counting(MemoryPrefixIndex):
    """A shared index that counts the batched stores it receives."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    def store_many(self, items: Sequence[tuple[str, Sequence[int]]]) -> None:
        self.batches.append(len(items))
        super().store_many(items)


def test_a_batched_store_reaches_the_shared_index_as_one_update() -> None:
    primary = Counting()
    index = ResilientIndex(primary, clock=Clock())
    index.register(IndexedInstance("md0", Tier.MD, "B"))
    index.register(IndexedInstance("p0", Tier.P, "A"))
    index.store_many([("md0", A), ("p0", A[:5]), ("md0", B)])
    assert primary.batches == [3]
    assert primary.match(B) == index.local.match(B) == {"md0": 30, "p0": 5}
    with pytest.raises(UnknownInstanceError, match="ghost"):
        index.store_many([("ghost", A), ("p0", B)])
    assert primary.batches == [3, 1]  # the known instance's chain only
    assert primary.match(B) == index.local.match(B) == {"md0": 30, "p0": 30}


def test_a_batched_store_queued_in_an_outage_is_replayed_chain_by_chain(
    server: fakeredis.FakeServer,
) -> None:
    clock = Clock()
    index = populated(server, clock)
    server.connected = False
    index.match(A)
    index.store_many([("md0", (*A, 41)), ("p0", B), ("md0", (*B, 9031))])
    assert index.match((*B, 9031)) == {"md0": 31, "p0": 30}  # the mirror has it
    server.connected = True
    clock.now += 2.0
    settle(index)
    assert index.stats.replayed_updates == 3
    assert shared(server).match((*B, 9031)) == {"md0": 31, "p0": 30}
    assert shared(server).match((*A, 41)) == {"md0": 41, "p0": 40}


def test_a_batched_store_that_finds_an_empty_restart_is_rebuilt(
    server: fakeredis.FakeServer,
) -> None:
    clock = Clock()
    index = populated(server, clock)
    restart_empty(server)
    index.store_many([("md0", (*A, 41)), ("p0", (*B, 9031))])  # "unknown instances"
    settle(index)
    assert shared(server).match((*A, 41)) == {"md0": 41, "p0": 40}
    assert shared(server).match((*B, 9031)) == {"md0": 30, "p0": 31}
    assert index.stats.rebuilds == 1

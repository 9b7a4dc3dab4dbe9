"""Replicas on one Redis: each sees the others' in-flight load, and one writes each
instance's KV events (a lease that passes on when its holder stops)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from engines_adapter.contract import EngineAdapter
from policies.tiers import Tier
from policies.types import Decision, Pipeline
from router.index.base import IndexedInstance
from router.index.memory_index import MemoryPrefixIndex
from router.index.resilient_index import ResilientIndex
from router.replicas import ReplicaSync
from router.service.metrics import ServiceMetrics
from router.service.peers import Peers
from router.service.pool import InstancePool
from router.service.schemas import InstanceConfig
from router.settings import ClusterSettings, ReplicaSettings
from tests.contract.conftest import delete_prefix, require_redis, unique_prefix

IDS = ["md0", "md1", "p0", "p1", "p2", "rld0"]


@pytest.fixture
def shared() -> Iterator[tuple[redis.Redis, str]]:
    client = redis.Redis.from_url(require_redis())
    prefix = unique_prefix()
    try:
        yield client, prefix
    finally:
        delete_prefix(client, prefix)
        client.close()


def replica(shared: tuple[redis.Redis, str], name: str, ttl_s: float = 3.0) -> ReplicaSync:
    client, prefix = shared
    return ReplicaSync(client, key_prefix=prefix, replica_id=name, ttl_s=ttl_s)


@pytest.mark.redis
def test_each_replica_sees_the_sum_of_the_others_load(shared: tuple[redis.Redis, str]) -> None:
    a, b, c = (replica(shared, n) for n in "abc")
    a.exchange({"p0": (1, 4096), "p1": (0, 0)})
    b.exchange({"p0": (2, 1000), "md0": (5, 0)})
    view = c.exchange({"p0": (7, 7)})
    assert view is not None
    assert view.load == {"p0": (3, 5096), "md0": (5, 0)}  # its own 7 is not in it
    assert view.replicas == 3
    # a's prefill ended: only what changed is sent, and the others see it at once
    a.exchange({"p0": (1, 0), "p1": (0, 0)})
    view = c.exchange({"p0": (7, 7)})
    assert view is not None
    assert view.load["p0"] == (3, 1000)


@pytest.mark.redis
def test_a_silent_replica_stops_counting(shared: tuple[redis.Redis, str]) -> None:
    a, b = replica(shared, "a", ttl_s=0.3), replica(shared, "b", ttl_s=0.3)
    a.exchange({"p0": (4, 4096)})
    view = b.exchange({})
    assert view is not None
    assert view.load == {"p0": (4, 4096)}
    time.sleep(0.45)  # a crashed: no heartbeat
    view = b.exchange({})
    assert view is not None
    assert view.load == {}
    assert view.replicas == 1


@pytest.mark.redis
def test_leases_are_spread_and_pass_on_when_a_replica_stops(
    shared: tuple[redis.Redis, str],
) -> None:
    a, b, c = (replica(shared, n, ttl_s=0.4) for n in "abc")
    first = a.exchange({}, IDS)
    assert first is not None
    assert first.leases == set(IDS)
    b.exchange({}, IDS)
    c.exchange({}, IDS)
    held = {}
    for _ in range(3):  # a passes on its extra leases, b and c take them
        for name, r in zip("abc", (a, b, c), strict=True):
            view = r.exchange({}, IDS)
            assert view is not None
            assert view.leases is not None
            held[name] = view.leases
    assert sorted(len(h) for h in held.values()) == [2, 2, 2]
    assert set().union(*held.values()) == set(IDS)
    assert not held["a"] & held["b"]
    assert not held["b"] & held["c"]
    assert not held["a"] & held["c"]
    # c stops without a word: after ttl_s its instances go to a and b
    time.sleep(0.5)
    for _ in range(2):
        for name, r in zip("ab", (a, b), strict=True):
            view = r.exchange({}, IDS)
            assert view is not None
            assert view.leases is not None
            held[name] = view.leases
    assert held["a"] | held["b"] == set(IDS)
    assert not held["a"] & held["b"]


@pytest.mark.redis
def test_a_clean_stop_hands_leases_over_at_once(shared: tuple[redis.Redis, str]) -> None:
    a, b = replica(shared, "a"), replica(shared, "b")
    view = a.exchange({"p0": (2, 10)}, IDS)
    assert view is not None
    assert view.leases == set(IDS)
    a.release(sorted(IDS))
    view = b.exchange({}, IDS)
    assert view is not None
    assert view.leases == set(IDS)
    assert view.load == {}
    assert view.replicas == 1


def test_an_unreachable_redis_costs_one_failed_call_per_retry_delay() -> None:
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    now = [0.0]
    sync = ReplicaSync(
        client, key_prefix="x", replica_id="a", retry_after_s=1.0, clock=lambda: now[0]
    )
    assert sync.exchange({"p0": (1, 1)}) is None
    assert sync.exchange({"p0": (1, 1)}) is None  # not tried: within the retry delay
    assert sync.failures == 1
    now[0] = 1.5
    assert sync.exchange({"p0": (1, 1)}) is None
    assert sync.failures == 2


CHAIN = tuple(range(1, 21))


def mirrored(writes: set[str]) -> tuple[ResilientIndex, MemoryPrefixIndex, list[float]]:
    now = [100.0]
    primary = MemoryPrefixIndex()
    index = ResilientIndex(primary, clock=lambda: now[0])
    index.handover.kv_writer = lambda iid: iid in writes
    index.handover.hold_s = 5.0
    for iid in ("p0", "md0"):
        index.register(IndexedInstance(iid, Tier.P if iid == "p0" else Tier.MD, "A"))
    return index, primary, now


def test_kv_events_of_an_instance_another_replica_writes_stay_in_the_mirror() -> None:
    index, primary, _ = mirrored(writes={"md0"})
    with index.handover.kv_events_of("p0"):
        index.store("p0", CHAIN)
    with index.handover.kv_events_of("md0"):
        index.store("md0", CHAIN[:5])
    index.store("p0", CHAIN[:3])  # a route this replica recorded: not a KV event
    assert index.local.match(CHAIN) == {"p0": 20, "md0": 5}  # this replica knows it all
    assert primary.match(CHAIN) == {"p0": 3, "md0": 5}  # Redis got one copy of each


def test_taking_an_instance_over_writes_what_the_shared_index_missed() -> None:
    writes: set[str] = set()
    index, primary, now = mirrored(writes)
    with index.handover.kv_events_of("p0"):
        index.store("p0", CHAIN[:4])  # long ago: the old holder wrote it
    now[0] += 10.0
    with index.handover.kv_events_of("p0"):
        index.store("p0", CHAIN)
        index.remove("p0", CHAIN[10:])
    assert primary.match(CHAIN) == {"p0": 0, "md0": 0}
    writes.add("p0")
    assert index.handover.take_over("p0", unwritten_s=3.0) == (2, False)  # the last 5 s, kept
    assert primary.match(CHAIN) == {"p0": 10, "md0": 0}
    assert index.handover.take_over("p0") == (0, False)  # sent once


def test_a_lease_nobody_held_for_longer_than_was_kept_clears_the_instance_first() -> None:
    """A replica that started 2 s ago takes a lease nobody held for 60 s (every replica
    was down, say): the shared index still has blocks the engine evicted meanwhile, and
    the removals are lost. It is cleared and written again from what this replica heard."""
    writes: set[str] = set()
    index, primary, now = mirrored(writes)
    primary.store("p0", CHAIN)  # what the last holder wrote, a minute ago
    now[0] += 2.0
    with index.handover.kv_events_of("p0"):
        index.store("p0", CHAIN[:3])  # heard since this replica started
    writes.add("p0")
    assert index.handover.take_over("p0", unwritten_s=60.0) == (1, True)
    assert primary.match(CHAIN) == {"p0": 3, "md0": 0}  # not 20: those may be gone


def test_a_lease_taken_within_what_was_kept_is_not_cleared() -> None:
    """The same replica, the lease unheld for 1.5 s of the 2 s it has been hearing the
    instance: its held events cover the stretch, nothing is cleared."""
    writes: set[str] = set()
    index, primary, now = mirrored(writes)
    primary.store("p0", CHAIN)
    now[0] += 2.0
    with index.handover.kv_events_of("p0"):
        index.remove("p0", CHAIN[15:])
    writes.add("p0")
    assert index.handover.take_over("p0", unwritten_s=1.5) == (1, False)
    assert primary.match(CHAIN) == {"p0": 15, "md0": 0}


@pytest.mark.redis
def test_an_exchange_says_how_long_a_lease_was_unheld(shared: tuple[redis.Redis, str]) -> None:
    """Never held: None. Released by a: how long ago. Held by b from then on: the time
    since b's last exchange. A replica restarted under the same name that finds its lease
    still held learns how long nobody renewed it."""
    a, b = replica(shared, "a"), replica(shared, "b")
    first = a.exchange({}, ["p0"])
    assert first is not None
    assert first.unwritten_s == {"p0": None}
    a.release(["p0"])
    time.sleep(0.3)
    taken = b.exchange({}, ["p0"])
    assert taken is not None
    assert taken.leases == {"p0"}
    unwritten = taken.unwritten_s["p0"]
    assert unwritten is not None
    assert 0.25 <= unwritten < 2.0
    time.sleep(0.2)
    renewed = replica(shared, "b").exchange({}, ["p0"])  # b again, as a new process
    assert renewed is not None
    assert renewed.leases == {"p0"}
    again = renewed.unwritten_s["p0"]
    assert again is not None
    assert 0.15 <= again < 2.0


@pytest.mark.redis
def test_an_admission_decided_on_an_older_view_is_refused_with_the_load_of_now(
    shared: tuple[redis.Redis, str],
) -> None:
    """b read the shared load, then a admitted a request to p0: b's decision, made on what
    it read, is not written, and b learns a's request; decided again, it is written."""
    a, b = replica(shared, "a"), replica(shared, "b")
    a.exchange({})
    seen = b.exchange({})
    assert seen is not None
    assert seen.load == {}
    first = a.admit({"p0": (0, 1024)}, seen.version)
    assert first is not None
    assert first.admitted
    assert first.version > seen.version  # a's load grew
    stale = b.admit({"p0": (0, 1024)}, seen.version)  # b also chose p0, on its old view
    assert stale is not None
    assert not stale.admitted
    assert stale.load == {"p0": (0, 1024)}
    assert stale.version == first.version
    again = b.admit({"p1": (0, 1024)}, stale.version)
    assert again is not None
    assert again.admitted
    view = a.exchange({"p0": (0, 1024)})
    assert view is not None
    assert view.load == {"p1": (0, 1024)}  # b's refused p0 was never written


@pytest.mark.redis
def test_only_load_that_grows_moves_the_version(shared: tuple[redis.Redis, str]) -> None:
    """A decision made before another replica's prefill ended stays valid (the view
    over-counted): ends are published without refusing the others' admissions."""
    a, b = replica(shared, "a"), replica(shared, "b")
    grown = a.exchange({"p0": (1, 2048)})
    assert grown is not None
    seen = b.exchange({})
    assert seen is not None
    assert seen.version == grown.version
    ended = a.exchange({"p0": (0, 0)})
    assert ended is not None
    assert ended.version == seen.version
    admitted = b.admit({"p0": (0, 512)}, seen.version)
    assert admitted is not None
    assert admitted.admitted
    assert admitted.load == {}


def _no_engine(config: InstanceConfig) -> EngineAdapter:
    raise AssertionError(f"no engine is built here ({config.instance_id})")


def test_a_decision_redis_does_not_answer_is_claimed_here_and_counted_as_alone() -> None:
    """Redis unreachable: each admission is let through (its work counts in this
    replica's load) and counted in pdd_router_replica_decisions_alone_total; the second
    is within the retry delay, so Redis is not even tried."""
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2,
                         retry=Retry(NoBackoff(), 0))  # fmt: skip
    sync = ReplicaSync(client, key_prefix="x", replica_id="a", retry_after_s=60.0)
    pool = InstancePool(ClusterSettings(), _no_engine)
    metrics = ServiceMetrics()
    peers = Peers(sync, pool, ResilientIndex(MemoryPrefixIndex()), metrics, ReplicaSettings())
    decision = Decision(policy="test", pipeline=Pipeline.P_MD, p_instance="p0",
                        md_instance="md0")  # fmt: skip
    assert peers.admission("r1", 100)(decision)
    assert peers.admission("r2", 60)(decision)
    assert pool.claims.total("p0") == (0, 160)  # prompt tokens to compute, none cached
    assert pool.claims.total("md0") == (2, 0)  # a stream each
    assert metrics.registry.get_sample_value("pdd_router_replica_decisions_alone_total") == 2
    assert sync.failures == 1

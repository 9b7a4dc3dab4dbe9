"""One contract for every PrefixIndex: memory, Redis (real server) and fakeredis."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from policies.tiers import Tier
from router.index.base import IndexedInstance, PrefixIndex, UnknownInstanceError

if TYPE_CHECKING:
    from conftest import FakeClock, IndexFactory

A = list(range(101, 111))  # a 10-block chain
B = [*A[:3], 201, 202, 203]  # shares 3 leading blocks with A
C = [301, 302]  # shares nothing


def _inst(
    instance_id: str, tier: Tier = Tier.P, dc: str = "dc-a", cap: int | None = None
) -> IndexedInstance:
    return IndexedInstance(instance_id, tier, dc, cap)


def _three(index: PrefixIndex) -> PrefixIndex:
    index.register(_inst("p1", Tier.P, "dc-a"))
    index.register(_inst("rld1", Tier.RLD, "dc-a"))
    index.register(_inst("md1", Tier.MD, "dc-b"))
    return index


def test_match_counts_leading_blocks_across_shared_prefixes(make_index: IndexFactory) -> None:
    index = _three(make_index())
    index.store("p1", A[:7])
    index.store("rld1", B)
    index.store("md1", A)

    assert index.match(A) == {"p1": 7, "rld1": 3, "md1": 10}
    assert index.match(B) == {"p1": 3, "rld1": 6, "md1": 3}
    assert index.match([*A[:5], 999]) == {"p1": 5, "rld1": 3, "md1": 5}
    assert index.match(C) == {"p1": 0, "rld1": 0, "md1": 0}
    assert index.match(A[:1]) == {"p1": 1, "rld1": 1, "md1": 1}
    assert index.num_blocks("p1") == 7
    assert index.num_blocks("rld1") == 6
    assert index.num_blocks("md1") == 10


def test_a_chain_that_diverges_early_matches_only_its_common_part(make_index: IndexFactory) -> None:
    index = make_index()
    index.register(_inst("x"))
    index.store("x", A)
    index.store("x", C)
    # Chained hashes: once a block differs, every later block differs too.
    assert index.match([A[0], 555, 556, 557]) == {"x": 1}
    assert index.match([*C, 777, 778]) == {"x": 2}
    assert index.match([999, 1000]) == {"x": 0}


def test_empty_index_and_empty_chain(make_index: IndexFactory) -> None:
    index = make_index()
    assert index.match(A) == {}
    assert index.instances() == []
    index.register(_inst("x"))
    index.store("x", [])
    assert index.num_blocks("x") == 0
    assert index.match([]) == {"x": 0}
    index.store("x", A)
    assert index.match([]) == {"x": 0}
    assert index.match(A) == {"x": 10}


def test_tier_and_datacenter_filters(make_index: IndexFactory) -> None:
    index = _three(make_index())
    index.register(_inst("p2", Tier.P, "dc-b"))
    index.store("p1", A)
    index.store("p2", A[:4])
    index.store("md1", A[:2])

    assert index.match(A, tier=Tier.P) == {"p1": 10, "p2": 4}
    assert index.match(A, tier=Tier.RLD) == {"rld1": 0}
    assert index.match(A, datacenter="dc-b") == {"p2": 4, "md1": 2}
    assert index.match(A, tier=Tier.P, datacenter="dc-b") == {"p2": 4}
    assert index.match(A, tier=Tier.MD, datacenter="dc-a") == {}
    assert index.match(A, datacenter="nowhere") == {}


def test_reregister_moves_an_instance_between_filters(make_index: IndexFactory) -> None:
    index = make_index()
    index.register(_inst("x", Tier.P, "dc-a"))
    index.store("x", A[:5])
    index.register(_inst("x", Tier.MD, "dc-b"))
    assert index.match(A, tier=Tier.P) == {}
    assert index.match(A, datacenter="dc-a") == {}
    assert index.match(A, tier=Tier.MD, datacenter="dc-b") == {"x": 5}  # blocks kept
    assert index.instances() == [_inst("x", Tier.MD, "dc-b")]


def test_instances_sorted_by_id_with_their_specs(make_index: IndexFactory) -> None:
    index = make_index()
    specs = [_inst("zeta", Tier.MD, "dc-b", 7), _inst("alpha"), _inst("mid", Tier.RLD, "dc-a", 3)]
    for spec in specs:
        index.register(spec)
    assert index.instances() == sorted(specs, key=lambda s: s.instance_id)


def test_remove_leaf_first_shortens_the_match(make_index: IndexFactory) -> None:
    index = _three(make_index())
    index.store("p1", A)
    index.store("md1", A)
    index.remove("p1", list(reversed(A[6:])))  # engines evict leaves first
    assert index.match(A) == {"p1": 6, "rld1": 0, "md1": 10}
    assert index.num_blocks("p1") == 6
    index.remove("p1", [A[5], 424242])  # unknown blocks are ignored
    assert index.match(A)["p1"] == 5
    assert index.num_blocks("p1") == 5
    index.remove("rld1", A)  # holds nothing: a no-op
    assert index.match(A) == {"p1": 5, "rld1": 0, "md1": 10}


def test_remove_a_branch_keeps_the_shared_prefix(make_index: IndexFactory) -> None:
    index = make_index()
    index.register(_inst("x"))
    index.store("x", A)
    index.store("x", B)
    index.remove("x", [203, 202, 201])
    assert index.match(B) == {"x": 3}
    assert index.match(A) == {"x": 10}
    assert index.num_blocks("x") == 10


def test_clear_forgets_one_instance_only(make_index: IndexFactory) -> None:
    index = _three(make_index())
    index.store("p1", A)
    index.store("md1", B)
    index.clear("p1")
    assert index.match(A) == {"p1": 0, "rld1": 0, "md1": 3}
    assert index.num_blocks("p1") == 0
    assert index.num_blocks("md1") == 6
    index.store("p1", A[:2])  # still registered, usable again
    assert index.match(A)["p1"] == 2


def test_unregister_forgets_the_instance_and_its_blocks(make_index: IndexFactory) -> None:
    index = _three(make_index())
    index.store("p1", A)
    index.store("md1", A[:4])
    index.unregister("p1")
    assert index.match(A) == {"rld1": 0, "md1": 4}
    assert [i.instance_id for i in index.instances()] == ["md1", "rld1"]
    with pytest.raises(UnknownInstanceError):
        index.store("p1", A)
    index.unregister("p1")  # idempotent
    index.register(_inst("p1"))
    assert index.num_blocks("p1") == 0
    assert index.match(A) == {"p1": 0, "rld1": 0, "md1": 4}


def test_slots_are_reused_without_leaking_blocks(make_index: IndexFactory) -> None:
    index = make_index()
    for i in range(40):  # more than 32 instances: several words of slots
        index.register(_inst(f"i{i:02d}"))
        index.store(f"i{i:02d}", A[: i % 11])
    for i in range(0, 40, 3):
        index.unregister(f"i{i:02d}")
    index.register(_inst("new1"))
    index.register(_inst("new2"))
    index.store("new2", A[:9])
    expected = {f"i{i:02d}": i % 11 for i in range(40) if i % 3}
    expected |= {"new1": 0, "new2": 9}
    assert index.match(A) == expected


@pytest.mark.parametrize("per_instance", [False, True])
def test_lru_eviction_at_capacity_removes_the_oldest_leaves(
    make_index: IndexFactory, per_instance: bool
) -> None:
    index = make_index(default_capacity_blocks=None if per_instance else 5)
    index.register(_inst("x", cap=5 if per_instance else None))
    index.store("x", [1, 2, 3])  # recency, oldest first: 3 2 1
    index.store("x", [10, 11, 12])  # 3 2 1 12 11 10: one too many, 3 goes
    assert index.num_blocks("x") == 5
    assert index.match([1, 2, 3]) == {"x": 2}
    assert index.match([10, 11, 12]) == {"x": 3}
    index.store("x", [20])  # then 2 goes
    assert index.match([1, 2, 3]) == {"x": 1}
    assert index.match([10, 11, 12]) == {"x": 3}
    assert index.match([20]) == {"x": 1}


def test_instance_capacity_overrides_the_default(make_index: IndexFactory) -> None:
    index = make_index(default_capacity_blocks=2)
    index.register(_inst("small"))
    index.register(_inst("big", cap=8))
    index.store("small", A)
    index.store("big", A)
    assert index.match(A) == {"small": 2, "big": 8}
    index.register(_inst("big", cap=3))  # shrinking evicts at once
    assert index.num_blocks("big") == 3
    assert index.match(A) == {"small": 2, "big": 3}


def test_restore_refreshes_recency(make_index: IndexFactory) -> None:
    index = make_index(default_capacity_blocks=6)
    index.register(_inst("x"))
    index.store("x", [1, 2])
    index.store("x", [5, 6])
    index.store("x", [1, 2])  # 1 2 are now the most recent
    index.store("x", [8, 9, 10, 11])  # 8 blocks: the oldest two (6, 5) go
    assert index.match([1, 2]) == {"x": 2}
    assert index.match([5, 6]) == {"x": 0}
    assert index.match([8, 9, 10, 11]) == {"x": 4}


def test_a_shared_prefix_is_refreshed_by_every_chain_through_it(make_index: IndexFactory) -> None:
    index = make_index(default_capacity_blocks=5)
    index.register(_inst("x"))
    index.store("x", [1, 2, 3])  # 3 2 1
    index.store("x", [1, 2, 4])  # 3 4 2 1
    index.store("x", [7])  # 3 4 2 1 7
    index.store("x", [8])  # 3 goes: its parents were touched since
    assert index.match([1, 2, 3]) == {"x": 2}
    assert index.match([1, 2, 4]) == {"x": 3}


def test_a_chain_longer_than_capacity_keeps_its_head(make_index: IndexFactory) -> None:
    index = make_index(default_capacity_blocks=3)
    index.register(_inst("x"))
    index.store("x", A)
    assert index.match(A) == {"x": 3}
    assert index.num_blocks("x") == 3
    index.store("x", [20, 21])  # 3 2 1 -> 21 20 evict the two oldest: 3 then 2
    assert index.match(A) == {"x": 1}
    assert index.match([20, 21]) == {"x": 2}


def test_ttl_forgets_blocks_not_touched_for_ttl_seconds(
    make_index: IndexFactory, clock: FakeClock
) -> None:
    index = make_index(ttl_s=10.0, clock=clock)
    index.register(_inst("x"))
    index.register(_inst("y"))
    index.store("x", [1, 2, 3])  # t = 0
    clock.advance(5)
    index.store("x", [1, 2])  # t = 5
    index.store("y", [1])
    clock.advance(4.5)  # t = 9.5: all fresh
    assert index.match([1, 2, 3]) == {"x": 3, "y": 1}
    clock.advance(0.5)  # t = 10: block 3 was touched 10 s ago
    assert index.match([1, 2, 3]) == {"x": 2, "y": 1}
    assert index.num_blocks("x") == 2
    clock.advance(4.9)  # t = 14.9
    assert index.match([1, 2, 3]) == {"x": 2, "y": 1}
    clock.advance(0.1)  # t = 15
    assert index.match([1, 2, 3]) == {"x": 0, "y": 0}
    assert index.num_blocks("x") == 0
    index.store("x", [1])  # a fresh touch holds again
    assert index.match([1, 2, 3]) == {"x": 1, "y": 0}


def test_ttl_expiry_mid_chain_and_capacity_together(
    make_index: IndexFactory, clock: FakeClock
) -> None:
    index = make_index(default_capacity_blocks=4, ttl_s=10.0, clock=clock)
    index.register(_inst("x"))
    index.store("x", A[:3])  # t = 0
    clock.advance(6)
    index.store("x", A[:2])  # t = 6: A0, A1 refreshed; A2 still from t = 0
    clock.advance(5)  # t = 11: A2 expired, A0 and A1 fresh
    assert index.match(A) == {"x": 2}
    index.store("x", [50, 51])  # expired A2 is purged first, nothing evicted
    assert index.num_blocks("x") == 4
    assert index.match(A) == {"x": 2}
    assert index.match([50, 51]) == {"x": 2}


@pytest.mark.parametrize("op", ["store", "remove", "clear", "num_blocks"])
def test_unknown_instance_raises_naming_it(make_index: IndexFactory, op: str) -> None:
    index = make_index()
    index.register(_inst("known"))
    calls = {
        "store": lambda: index.store("ghost-7", A),
        "remove": lambda: index.remove("ghost-7", A),
        "clear": lambda: index.clear("ghost-7"),
        "num_blocks": lambda: index.num_blocks("ghost-7"),
    }
    with pytest.raises(UnknownInstanceError, match="ghost-7"):
        calls[op]()
    assert index.match(A) == {"known": 0}


def test_long_chain_with_many_distinct_depths(make_index: IndexFactory) -> None:
    chain = list(range(10_000, 12_000))  # 2,000 blocks
    depths = [0, 1, 2, 3, 255, 256, 257, 1000, 1023, 1999, 2000]
    index = make_index()
    for i, depth in enumerate(depths):
        index.register(_inst(f"d{i:02d}"))
        index.store(f"d{i:02d}", chain[:depth])
        index.store(f"d{i:02d}", [90_000 + 10 * i, 90_001 + 10 * i])  # other chains too
    assert index.match(chain) == {f"d{i:02d}": depth for i, depth in enumerate(depths)}
    assert index.match(chain[:300]) == {
        f"d{i:02d}": min(depth, 300) for i, depth in enumerate(depths)
    }


# ------------------------------------------------------------------ store_many


def test_store_many_stores_each_chain_in_order(make_index: IndexFactory) -> None:
    index = _three(make_index(default_capacity_blocks=5))
    index.store_many([("p1", [1, 2, 3]), ("md1", A), ("p1", [10, 11, 12]), ("p1", [1])])
    # p1, oldest first: 3 2 1 12 11 10, then 1 again; one too many: 3 goes
    assert index.num_blocks("p1") == 5
    assert index.match([1, 2, 3]) == {"p1": 2, "rld1": 0, "md1": 0}
    assert index.match([10, 11, 12]) == {"p1": 3, "rld1": 0, "md1": 0}
    assert index.match(A) == {"p1": 0, "rld1": 0, "md1": 5}  # a chain over capacity: its head
    index.store_many([("p1", [20])])  # then 2, the oldest, goes
    assert index.match([1, 2, 3]) == {"p1": 1, "rld1": 0, "md1": 0}
    index.store_many([])
    assert index.num_blocks("p1") == 5


def test_store_many_of_one_instance_keeps_each_chains_parents_more_recent(
    make_index: IndexFactory,
) -> None:
    index = make_index(default_capacity_blocks=5)
    index.register(_inst("x"))
    index.store_many([("x", [1, 2, 3]), ("x", [1, 2, 4]), ("x", [7]), ("x", [8])])
    assert index.match([1, 2, 3]) == {"x": 2}  # 3 went: its parents were touched since
    assert index.match([1, 2, 4]) == {"x": 3}
    assert index.match([7]) == index.match([8]) == {"x": 1}


def test_store_many_skips_unknown_instances_stores_the_rest_and_names_them(
    make_index: IndexFactory,
) -> None:
    index = _three(make_index())
    with pytest.raises(UnknownInstanceError, match="'ghost-7', 'ghost-8'"):
        index.store_many([("p1", A[:4]), ("ghost-7", A), ("md1", A), ("ghost-8", B)])
    assert index.match(A) == {"p1": 4, "rld1": 0, "md1": 10}
    assert [i.instance_id for i in index.instances()] == ["md1", "p1", "rld1"]
    with pytest.raises(UnknownInstanceError, match="ghost-7"):
        index.store_many([("ghost-7", [])])


def test_store_many_with_a_ttl_touches_every_chain(
    make_index: IndexFactory, clock: FakeClock
) -> None:
    index = make_index(ttl_s=10.0, clock=clock)
    index.register(_inst("x"))
    index.store_many([("x", [1, 2, 3]), ("x", [5])])
    clock.advance(6)
    index.store_many([("x", [1, 2])])
    clock.advance(5)  # 3 and 5 expired, 1 and 2 fresh
    assert index.match([1, 2, 3]) == {"x": 2}
    assert index.match([5]) == {"x": 0}
    assert index.num_blocks("x") == 2


def test_store_many_of_a_long_chain_and_many_chains(make_index: IndexFactory) -> None:
    long = list(range(50_000, 60_000))  # longer than one Redis script call carries
    index = make_index()
    index.register(_inst("x"))
    index.register(_inst("y"))
    chains = [[70_000 + 40 * k + j for j in range(k % 40 + 1)] for k in range(300)]
    index.store_many([("x", long[:6000]), *(("y", c) for c in chains), ("x", long)])
    assert index.match(long) == {"x": 10_000, "y": 0}
    assert index.num_blocks("y") == sum(len(c) for c in chains)
    assert all(index.match(c) == {"x": 0, "y": len(c)} for c in chains[::37])

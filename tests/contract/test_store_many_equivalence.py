"""``store_many`` leaves every PrefixIndex as storing each chain in turn would, on random
batches: the same matches, the same sizes, and the same LRU order (drained at the end),
as the same backend and the in-memory index storing one chain after another."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.tiers import Tier
from router.index.base import IndexedInstance, PrefixIndex, UnknownInstanceError
from router.index.memory_index import MemoryPrefixIndex

if TYPE_CHECKING:
    from conftest import FakeClock, IndexFactory

# Chains are paths in a small tree of prefixes (block k's parent is k // 2), so that
# they share prefixes as chained hashes do.
NODES = list(range(1, 32))
IDS = ["a", "b", "c"]
GHOST = "ghost"


def chain_to(node: int) -> list[int]:
    out = []
    while node:
        out.append(node)
        node //= 2
    return out[::-1]


items = st.tuples(st.sampled_from([*IDS, *IDS, GHOST]), st.sampled_from(NODES))
batches = st.lists(
    st.tuples(st.lists(items, max_size=12), st.sampled_from([0.0, 1.0, 4.0])),
    min_size=1,
    max_size=6,
)
caps = st.fixed_dictionaries({iid: st.sampled_from([None, 3, 8]) for iid in IDS})


def _apply_one_by_one(index: PrefixIndex, batch: list[tuple[str, list[int]]]) -> bool:
    unknown = False
    for iid, chain in batch:
        try:
            index.store(iid, chain)
        except UnknownInstanceError:
            unknown = True
    return unknown


def _apply_batched(index: PrefixIndex, batch: list[tuple[str, list[int]]]) -> bool:
    try:
        index.store_many(batch)
    except UnknownInstanceError:
        return True
    return False


def _same_state(*indexes: PrefixIndex) -> None:
    for node in NODES[len(NODES) // 2 :]:  # the leaves: every chain is a prefix of one
        chain = chain_to(node)
        first, *others = (index.match(chain) for index in indexes)
        assert all(other == first for other in others)
    for iid in IDS:
        first_size, *sizes = (index.num_blocks(iid) for index in indexes)
        assert all(size == first_size for size in sizes)


EXAMPLES = {"memory": 60, "redis": 25, "fakeredis": 8}


@pytest.mark.parametrize(
    "backend", ["memory", pytest.param("redis", marks=pytest.mark.redis), "fakeredis"]
)
@pytest.mark.parametrize("ttl", [None, 5.0])
def test_store_many_equals_one_store_after_another(
    backend: str,
    ttl: float | None,
    backend_factory: Callable[[str], tuple[IndexFactory, Callable[[], None]]],
    fake_clock_type: type[FakeClock],
) -> None:
    @settings(
        max_examples=EXAMPLES[backend],
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(batches=batches, caps=caps, default_cap=st.sampled_from([None, 6]))
    def check(
        batches: list[tuple[list[tuple[str, int]], float]],
        caps: dict[str, int | None],
        default_cap: int | None,
    ) -> None:
        clock = fake_clock_type()
        (make_one, clean_one), (make_many, clean_many) = (
            backend_factory(backend),
            backend_factory(backend),
        )
        try:
            one = make_one(default_capacity_blocks=default_cap, ttl_s=ttl, clock=clock)
            many = make_many(default_capacity_blocks=default_cap, ttl_s=ttl, clock=clock)
            ref = MemoryPrefixIndex(default_capacity_blocks=default_cap, ttl_s=ttl, clock=clock)
            for index in (one, many, ref):
                for iid in IDS:
                    index.register(IndexedInstance(iid, Tier.P, "dc-a", caps[iid]))
            for batch_nodes, seconds in batches:
                clock.advance(seconds)
                batch = [(iid, chain_to(node)) for iid, node in batch_nodes]
                unknown = _apply_one_by_one(ref, batch)
                assert _apply_batched(many, batch) == _apply_one_by_one(one, batch) == unknown
                _same_state(ref, one, many)
            # New blocks one at a time push the held ones out in LRU order.
            for k in range(8):
                for index in (one, many, ref):
                    for iid in IDS:
                        index.store(iid, [1000 + k])
                _same_state(ref, one, many)
        finally:
            clean_one()
            clean_many()

    check()

"""The LRU features against a brute-force LRU: ``TouchOrder``'s reuse distances,
``touched_since`` and ``lru_frac`` (``lru_blocks``) on random sequences of stores."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from router.predictor.features import lru_blocks
from router.predictor.recency import TouchOrder
from router.predictor.tracking import InstanceActivity


class BruteLRU:
    """An LRU cache of ``capacity`` blocks, stored as the engines and the index store a
    chain: last block first, so a chain's parents are more recent than its children."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def store(self, chain: list[int]) -> None:
        for block in reversed(chain):
            self.blocks[block] = None
            self.blocks.move_to_end(block)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)

    def held(self, chain: list[int]) -> int:
        """Leading blocks of ``chain`` in the cache."""
        n = 0
        while n < len(chain) and chain[n] in self.blocks:
            n += 1
        return n

    def newer_than(self, block: int) -> int:
        """Blocks touched after ``block`` (more recent in the LRU order)."""
        order = list(self.blocks)
        return len(order) - order.index(block) - 1


def random_chains(
    rng: random.Random, n: int, branching: int = 3, depth: int = 9
) -> list[list[int]]:
    """Chains of prefix hashes: random paths in a small tree (shared prefixes, forks)."""
    ids: dict[tuple[int, ...], int] = {}
    chains = []
    for _ in range(n):
        path = tuple(rng.randrange(branching) for _ in range(rng.randint(1, depth)))
        chains.append([ids.setdefault(path[: k + 1], len(ids)) for k in range(len(path))])
    return chains


@pytest.mark.parametrize("seed", range(5))
def test_touch_order_counts_what_was_touched_after_a_stamp(seed: int) -> None:
    rng = random.Random(seed)
    order = TouchOrder(size=4)  # small, so it grows and compacts along the way
    live: dict[int, int] = {}  # block -> its stamp, the brute-force record
    for _ in range(400):
        if live and rng.random() < 0.3:  # forget some blocks
            for block in rng.sample(sorted(live), rng.randint(1, min(3, len(live)))):
                order.add(live.pop(block), -1)
            continue
        stamp, mapping = order.new_stamp()
        if mapping is not None:
            live = {b: mapping[s] for b, s in live.items()}
        for block in rng.sample(range(40), rng.randint(1, 5)):  # touch, or touch again
            if block in live:
                order.add(live[block], -1)
            live[block] = stamp
            order.add(stamp, 1)
        assert order.live == len(live)
        for s in set(live.values()):
            assert order.newer_than(s) == sum(1 for t in live.values() if t > s)
            assert order.count(s) == sum(1 for t in live.values() if t == s)


@pytest.mark.parametrize("seed", range(8))
def test_lru_frac_and_touched_since_match_a_brute_force_lru(seed: int) -> None:
    rng = random.Random(seed)
    capacity = rng.choice([5, 12, 30])
    activity = InstanceActivity(capacity=10_000)  # the index remembers every route
    lru = BruteLRU(capacity)
    chains = random_chains(rng, 1500)  # more stores than TouchOrder's first size of stamps
    for step, chain in enumerate(chains):
        query = chains[rng.randrange(len(chains))]
        recorded = 0  # leading blocks of the query the index records (its raw match)
        while recorded < len(query) and query[recorded] in activity.touch:
            recorded += 1
        assert lru_blocks(activity, query, recorded, capacity) == lru.held(query)
        activity.stored(chain, float(step), 60.0)
        lru.store(chain)
    assert activity.order.live == len(activity.touch)


@pytest.mark.parametrize("seed", range(3))
def test_touched_since_is_the_reuse_distance_of_the_deepest_block(seed: int) -> None:
    rng = random.Random(seed)
    activity = InstanceActivity(capacity=10_000)
    unbounded = BruteLRU(10_000)  # nothing evicted: its order is every block's recency
    for step, chain in enumerate(random_chains(rng, 600)):
        activity.stored(chain, float(step), 60.0)
        unbounded.store(chain)
        block = rng.choice(list(activity.touch))
        newer = activity.order.newer_than(activity.touch[block][2])
        # the stamp counts the blocks of later stores; blocks of the same store that are
        # more recent than this one (its parents) are not counted
        same_store = sum(1 for b, v in activity.touch.items() if v[2] == activity.touch[block][2])
        assert newer <= unbounded.newer_than(block) <= newer + same_store - 1


def test_an_index_bounded_to_the_capacity_agrees_with_the_lru() -> None:
    """When the index itself keeps only ``capacity`` blocks, lru_frac is its raw match."""
    rng = random.Random(11)
    activity = InstanceActivity(capacity=20)
    chains = random_chains(rng, 600)
    for step, chain in enumerate(chains[:300]):
        activity.stored(chain, float(step), 60.0)
        query = rng.choice(chains)
        recorded = 0
        while recorded < len(query) and query[recorded] in activity.touch:
            recorded += 1
        assert lru_blocks(activity, query, recorded, 20) == recorded

"""Every PrefixIndex against a naive model, on random sequences of operations.

The model keeps, per instance, an LRU list of (block, last touch time) and answers a
match by walking each instance's leading blocks: no bisection, no bitmaps. Chains are
paths in a small tree of prefixes (so they share prefixes, as chained hashes do) and
removals drop a suffix of a chain leaf first, as engines evict.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from policies.tiers import Tier
from router.index.base import IndexedInstance, PrefixIndex, UnknownInstanceError

if TYPE_CHECKING:
    from conftest import FakeClock, IndexFactory

# A tree of prefixes: blocks 1 and 2 are roots, 3..40 a bushy binary tree under them,
# 41..52 a long spine under block 9. A block's id stands for its whole prefix, like a
# chained hash.
PARENT: dict[int, int | None] = {1: None, 2: None}
PARENT |= {k: (k - 1) // 2 for k in range(3, 41)}
PARENT |= {41: 9} | {k: k - 1 for k in range(42, 53)}
NODES = sorted(PARENT)
CHILDREN: dict[int, set[int]] = {k: set() for k in NODES}
for _k, _p in PARENT.items():
    if _p is not None:
        CHILDREN[_p].add(_k)


def chain_to(node: int) -> list[int]:
    out: list[int] = []
    cur: int | None = node
    while cur is not None:
        out.append(cur)
        cur = PARENT[cur]
    return out[::-1]


IDS = ["a", "b", "c", "d"]
TIERS = [Tier.P, Tier.RLD, Tier.MD]
DCS = ["dc-a", "dc-b"]


@dataclass
class _Inst:
    spec: IndexedInstance
    blocks: OrderedDict[int, float] = field(default_factory=OrderedDict)


class Model:
    """The reference: walk, per instance an ordered LRU of blocks with touch times."""

    def __init__(self, capacity: int | None, ttl: float | None, clock: Callable[[], float]):
        self.capacity = capacity
        self.ttl = ttl
        self.clock = clock
        self.insts: dict[str, _Inst] = {}

    def _fresh(self, touched: float) -> bool:
        return self.ttl is None or self.clock() - touched < self.ttl

    def _purge(self, inst: _Inst) -> None:
        for block, touched in list(inst.blocks.items()):
            if not self._fresh(touched):
                del inst.blocks[block]
        cap = inst.spec.capacity_blocks or self.capacity
        while cap is not None and len(inst.blocks) > cap:
            inst.blocks.popitem(last=False)

    def register(self, spec: IndexedInstance) -> None:
        inst = self.insts.setdefault(spec.instance_id, _Inst(spec))
        inst.spec = spec
        self._purge(inst)

    def unregister(self, instance_id: str) -> None:
        self.insts.pop(instance_id, None)

    def store(self, instance_id: str, chain: list[int]) -> None:
        inst = self.insts[instance_id]
        now = self.clock()
        for block in reversed(chain):
            inst.blocks.pop(block, None)
            inst.blocks[block] = now
        self._purge(inst)

    def remove(self, instance_id: str, blocks: list[int]) -> None:
        for block in blocks:
            self.insts[instance_id].blocks.pop(block, None)

    def clear(self, instance_id: str) -> None:
        self.insts[instance_id].blocks.clear()

    def held(self, instance_id: str) -> set[int]:
        inst = self.insts[instance_id]
        return {b for b, t in inst.blocks.items() if self._fresh(t)}

    def match(self, chain: list[int], tier: Tier | None, dc: str | None) -> dict[str, int]:
        out = {}
        for instance_id, inst in self.insts.items():
            if (tier is None or inst.spec.tier == tier) and (
                dc is None or inst.spec.datacenter == dc
            ):
                held = self.held(instance_id)
                depth = 0
                while depth < len(chain) and chain[depth] in held:
                    depth += 1
                out[instance_id] = depth
        return out


def machine_for(  # noqa: C901 -- one hypothesis rule per index operation, closures over the index
    make: IndexFactory, clock: FakeClock, capacity: int | None, ttl: float | None
) -> type[RuleBasedStateMachine]:
    class IndexMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.index: PrefixIndex = make(default_capacity_blocks=capacity, ttl_s=ttl, clock=clock)
            self.model = Model(capacity, ttl, clock)
            for instance_id in IDS:  # start each example empty (shared stores)
                self.index.unregister(instance_id)

        @rule(
            instance_id=st.sampled_from(IDS),
            tier=st.sampled_from(TIERS),
            dc=st.sampled_from(DCS),
            cap=st.sampled_from([None, None, 3, 8]),
        )
        def register(self, instance_id: str, tier: Tier, dc: str, cap: int | None) -> None:
            spec = IndexedInstance(instance_id, tier, dc, cap)
            self.index.register(spec)
            self.model.register(spec)

        @rule(instance_id=st.sampled_from(IDS))
        def unregister(self, instance_id: str) -> None:
            self.index.unregister(instance_id)
            self.model.unregister(instance_id)

        @rule(instance_id=st.sampled_from(IDS), node=st.sampled_from(NODES))
        def store(self, instance_id: str, node: int) -> None:
            chain = chain_to(node)
            if instance_id not in self.model.insts:
                with pytest.raises(UnknownInstanceError):
                    self.index.store(instance_id, chain)
                return
            self.index.store(instance_id, chain)
            self.model.store(instance_id, chain)

        @rule(
            batch=st.lists(
                st.tuples(st.sampled_from(IDS), st.sampled_from(NODES)), min_size=1, max_size=5
            )
        )
        def store_many(self, batch: list[tuple[str, int]]) -> None:
            items = [(instance_id, chain_to(node)) for instance_id, node in batch]
            if any(instance_id not in self.model.insts for instance_id, _ in items):
                with pytest.raises(UnknownInstanceError):
                    self.index.store_many(items)
            else:
                self.index.store_many(items)
            for instance_id, chain in items:  # the others are stored all the same
                if instance_id in self.model.insts:
                    self.model.store(instance_id, chain)

        @rule(
            instance_id=st.sampled_from(IDS),
            node=st.sampled_from(NODES),
            k=st.integers(min_value=1, max_value=4),
        )
        def remove_suffix(self, instance_id: str, node: int, k: int) -> None:
            if instance_id not in self.model.insts:
                with pytest.raises(UnknownInstanceError):
                    self.index.remove(instance_id, [node])
                return
            suffix = chain_to(node)[-k:]
            held = self.model.held(instance_id)
            # An engine only evicts a block once no cached block extends it.
            if any((CHILDREN[b] & held) - set(suffix) for b in suffix):
                return
            leaf_first = list(reversed(suffix))
            self.index.remove(instance_id, leaf_first)
            self.model.remove(instance_id, leaf_first)

        @rule(instance_id=st.sampled_from(IDS))
        def clear(self, instance_id: str) -> None:
            if instance_id not in self.model.insts:
                with pytest.raises(UnknownInstanceError):
                    self.index.clear(instance_id)
                return
            self.index.clear(instance_id)
            self.model.clear(instance_id)

        @rule(seconds=st.sampled_from([0.5, 2.0, 4.0, 9.99, 10.0]))
        def advance(self, seconds: float) -> None:
            clock.advance(seconds)

        @rule(
            node=st.sampled_from(NODES),
            extra=st.integers(min_value=0, max_value=2),
            tier=st.sampled_from([None, *TIERS]),
            dc=st.sampled_from([None, *DCS]),
        )
        def match(self, node: int, extra: int, tier: Tier | None, dc: str | None) -> None:
            chain = chain_to(node) + [1000 + node * 10 + i for i in range(extra)]
            assert self.index.match(chain, tier=tier, datacenter=dc) == self.model.match(
                chain, tier, dc
            )

        @invariant()
        def same_instances_and_sizes(self) -> None:
            assert self.index.instances() == sorted(
                (i.spec for i in self.model.insts.values()), key=lambda s: s.instance_id
            )
            for instance_id in self.model.insts:
                assert self.index.num_blocks(instance_id) == len(self.model.held(instance_id))

        def teardown(self) -> None:
            for instance_id in IDS:
                self.index.unregister(instance_id)

    return IndexMachine


EXAMPLES = {"memory": 100, "redis": 50, "fakeredis": 30}


@pytest.mark.parametrize(
    "backend", ["memory", pytest.param("redis", marks=pytest.mark.redis), "fakeredis"]
)
@pytest.mark.parametrize(("capacity", "ttl"), [(None, None), (6, None), (None, 10.0), (5, 10.0)])
def test_index_agrees_with_naive_model(
    backend: str,
    capacity: int | None,
    ttl: float | None,
    backend_factory: Callable[[str], tuple[IndexFactory, Callable[[], None]]],
    fake_clock_type: type[FakeClock],
) -> None:
    make, cleanup = backend_factory(backend)
    clock = fake_clock_type()
    try:
        run_state_machine_as_test(
            machine_for(make, clock, capacity, ttl),
            settings=settings(
                max_examples=EXAMPLES[backend],
                stateful_step_count=30,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    finally:
        cleanup()

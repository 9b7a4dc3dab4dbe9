"""KV events re-hashed under the router's chain reach the index and match real prompts."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from engines_adapter.contract import KVEvent, KVEventBatch
from policies.tiers import Tier
from router.hashing import chain_hashes
from router.index.base import IndexedInstance, UnknownInstanceError
from router.index.memory_index import MemoryPrefixIndex
from router.kv_ingest import KVEventIngestor
from router.predictor.tracking import TrackedIndex

ENGINE_BS = 32
ROUTER_BS = 16


def setup() -> tuple[MemoryPrefixIndex, KVEventIngestor]:
    index = MemoryPrefixIndex()
    index.register(IndexedInstance("md0", Tier.MD, "B"))
    return index, KVEventIngestor(index, block_size=ROUTER_BS, seed=3)


def stored(hashes: list[int | str], parent: int | str | None, tokens: list[int]) -> KVEvent:
    return KVEvent(
        type="BlockStored",
        block_hashes=list(hashes),
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=ENGINE_BS,
    )


def batch(*events: KVEvent) -> KVEventBatch:
    return KVEventBatch(instance_id="md0", timestamp=0.0, events=list(events))


def test_stored_blocks_in_two_events_match_the_prompt_hashed_whole() -> None:
    index, ingest = setup()
    prompt = list(range(100, 100 + 4 * ENGINE_BS + 5))
    # the engine reports its first two blocks, then two more naming their parent
    ingest.apply(batch(stored([901, 902], None, prompt[: 2 * ENGINE_BS])))
    ingest.apply(batch(stored([903, 904], 902, prompt[2 * ENGINE_BS : 4 * ENGINE_BS])))
    chain = chain_hashes(prompt, ROUTER_BS, seed=3)
    # 4 engine blocks = 8 router blocks; the partial tail was never stored
    assert index.match(chain.hashes) == {"md0": 8}
    assert ingest.stats.stored_blocks == 8


def test_removal_by_engine_hash_and_clear() -> None:
    index, ingest = setup()
    prompt = list(range(3 * ENGINE_BS))
    ingest.apply(batch(stored([1, 2, 3], None, prompt)))
    chain = chain_hashes(prompt, ROUTER_BS, seed=3).hashes
    assert index.match(chain)["md0"] == 6
    ingest.apply(batch(KVEvent(type="BlockRemoved", block_hashes=[3])))
    assert index.match(chain)["md0"] == 4
    ingest.apply(batch(KVEvent(type="AllBlocksCleared")))
    assert index.match(chain)["md0"] == 0
    assert ingest.stats.clears == 1


def test_orphans_and_unaligned_blocks_are_counted_not_guessed() -> None:
    index, ingest = setup()
    ingest.apply(batch(stored([7], 999, list(range(ENGINE_BS)))))  # parent never seen
    bad = KVEvent(type="BlockStored", block_hashes=[8], token_ids=list(range(24)), block_size=24)
    ingest.apply(batch(bad))
    assert ingest.stats.orphans == 1
    assert ingest.stats.unaligned == 1
    assert index.num_blocks("md0") == 0


def test_string_engine_hashes_work() -> None:
    index, ingest = setup()
    prompt = list(range(2 * ENGINE_BS))
    ingest.apply(batch(stored(["a1"], None, prompt[:ENGINE_BS])))
    ingest.apply(batch(stored(["b2"], "a1", prompt[ENGINE_BS:])))
    assert index.match(chain_hashes(prompt, ROUTER_BS, seed=3).hashes)["md0"] == 4


def test_a_block_stored_twice_is_gone_only_after_two_removals() -> None:
    index, ingest = setup()
    prompt = list(range(ENGINE_BS))
    chain = chain_hashes(prompt, ROUTER_BS, seed=3).hashes
    ingest.apply(batch(stored([5], None, prompt)))
    ingest.apply(batch(stored([5], None, prompt)))  # a second request computed it too
    ingest.apply(batch(KVEvent(type="BlockRemoved", block_hashes=[5])))
    assert index.match(chain)["md0"] == 2
    ingest.apply(batch(KVEvent(type="BlockRemoved", block_hashes=[5])))
    assert index.match(chain)["md0"] == 0


class Recording(MemoryPrefixIndex):
    """An in-memory index that records the updates it receives."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []  # (method, chains or blocks)
        self._batched = False

    def store(self, instance_id: str, chain: Sequence[int]) -> None:
        if not self._batched:
            self.calls.append(("store", len(chain)))
        super().store(instance_id, chain)

    def store_many(self, items: Sequence[tuple[str, Sequence[int]]]) -> None:
        self.calls.append(("store_many", len(items)))
        self._batched = True
        try:
            super().store_many(items)
        finally:
            self._batched = False

    def remove(self, instance_id: str, blocks: Sequence[int]) -> None:
        self.calls.append(("remove", len(blocks)))
        super().remove(instance_id, blocks)

    def clear(self, instance_id: str) -> None:
        self.calls.append(("clear", 0))
        super().clear(instance_id)


class Heard:
    """An observer keeping what it heard, in order."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, int]] = []

    def stored(self, instance_id: str, blocks: Sequence[int], engine_block_size: int) -> None:
        self.heard.append(("stored", len(blocks)))

    def lost(self, instance_id: str) -> None:
        self.heard.append(("lost", 0))


def _run_events(prompt: list[int]) -> list[KVEvent]:
    """Stored runs of one engine block each along ``prompt``, each naming its parent."""
    events = []
    for j in range(len(prompt) // ENGINE_BS):
        parent = None if j == 0 else 700 + j - 1
        events.append(stored([700 + j], parent, prompt[j * ENGINE_BS : (j + 1) * ENGINE_BS]))
    return events


def test_consecutive_stored_events_reach_the_index_as_one_update() -> None:
    index = Recording()
    index.register(IndexedInstance("md0", Tier.MD, "B"))
    heard = Heard()
    ingest = KVEventIngestor(index, block_size=ROUTER_BS, seed=3, observer=heard)
    prompt = list(range(5 * ENGINE_BS))
    s0, s1, s2, s3, s4 = _run_events(prompt)
    ingest.apply(batch(s0, s1, s2))
    assert index.calls == [("store_many", 3)]
    chain = chain_hashes(prompt, ROUTER_BS, seed=3).hashes
    assert index.match(chain) == {"md0": 6}
    assert heard.heard == [("stored", 2)] * 3  # once the index has them, in order
    # a removal or a clear reaches the index after the stores before it, before the later
    index.calls.clear()
    removed = KVEvent(type="BlockRemoved", block_hashes=[702])
    ingest.apply(batch(s3, removed, s4, KVEvent(type="AllBlocksCleared"), s0, s1))
    assert index.calls == [
        ("store_many", 1),
        ("remove", 2),
        ("store_many", 1),
        ("clear", 0),
        ("store_many", 2),
    ]
    assert index.match(chain) == {"md0": 4}
    assert ingest.stats.stored_blocks == 6 + 2 + 2 + 4
    assert ingest.stats.removed_blocks == 2


def test_a_removal_of_nothing_held_and_a_loss_keep_the_order_without_splitting_stores() -> None:
    index = Recording()
    index.register(IndexedInstance("md0", Tier.MD, "B"))
    heard = Heard()
    ingest = KVEventIngestor(index, block_size=ROUTER_BS, seed=3, observer=heard)
    s0, s1, s2 = _run_events(list(range(3 * ENGINE_BS)))
    orphan = stored([9], 999, list(range(ENGINE_BS)))  # parent never seen: a loss
    unknown_removal = KVEvent(type="BlockRemoved", block_hashes=[123456])
    ingest.apply(batch(s0, unknown_removal, s1, orphan, s2))
    assert index.calls == [("store_many", 2), ("store_many", 1)]
    assert heard.heard == [("stored", 2), ("stored", 2), ("lost", 0), ("stored", 2)]


async def test_apply_in_chunks_has_every_chunk_in_the_index_before_it_yields() -> None:
    index = Recording()
    index.register(IndexedInstance("md0", Tier.MD, "B"))
    ingest = KVEventIngestor(index, block_size=ROUTER_BS, seed=3)
    prompt = list(range(4 * ENGINE_BS))
    events = _run_events(prompt)
    await ingest.apply_in_chunks(batch(*events), chunk_cost=2 * (1 + 1 + ENGINE_BS))
    assert index.calls == [("store_many", 2), ("store_many", 2)]
    assert index.match(chain_hashes(prompt, ROUTER_BS, seed=3).hashes) == {"md0": 8}


def test_an_instance_removed_meanwhile_raises_once_its_events_are_applied() -> None:
    index = Recording()
    ingest = KVEventIngestor(index, block_size=ROUTER_BS, seed=3)
    with pytest.raises(UnknownInstanceError, match="md0"):
        ingest.apply(batch(*_run_events(list(range(2 * ENGINE_BS)))))
    assert index.calls == [("store_many", 2)]
    assert ingest.stats.stored_blocks == 0


def test_a_tracked_index_records_the_batched_stores() -> None:
    clock = iter(range(100, 200)).__next__
    tracked = TrackedIndex(MemoryPrefixIndex(), lambda: float(clock()))
    tracked.register(IndexedInstance("md0", Tier.MD, "B"))
    ingest = KVEventIngestor(tracked, block_size=ROUTER_BS, seed=3)
    ingest.apply(batch(*_run_events(list(range(3 * ENGINE_BS)))))
    activity = tracked.activity("md0")
    assert activity is not None
    assert activity.inserted == 6
    assert len(activity.touch) == 6


def test_the_simulated_engines_salted_events_match_the_salted_prompt_only() -> None:
    from engine_sim.cache import SimEngineCache
    from router.hashing import HashExtras

    index, ingest = setup()
    cache = SimEngineCache(block_size=ENGINE_BS)
    prompt = list(range(200, 200 + 3 * ENGINE_BS))
    ingest.apply(batch(*cache.store(cache.chain(prompt, salt="tenant-a"))))
    salted = chain_hashes(prompt, ROUTER_BS, seed=3, extras=HashExtras(cache_salt="tenant-a"))
    assert index.match(salted.hashes) == {"md0": 6}
    other = chain_hashes(prompt, ROUTER_BS, seed=3, extras=HashExtras(cache_salt="tenant-b"))
    assert index.match(other.hashes).get("md0", 0) == 0
    assert index.match(chain_hashes(prompt, ROUTER_BS, seed=3).hashes).get("md0", 0) == 0

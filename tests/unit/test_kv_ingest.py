"""KV events re-hashed under the router's chain reach the index and match real prompts."""

from __future__ import annotations

from engines_adapter.contract import KVEvent, KVEventBatch
from policies.tiers import Tier
from router.hashing import chain_hashes
from router.index.base import IndexedInstance
from router.index.memory_index import MemoryPrefixIndex
from router.kv_ingest import KVEventIngestor

ENGINE_BS = 32
ROUTER_BS = 16


def setup() -> tuple[MemoryPrefixIndex, KVEventIngestor]:
    index = MemoryPrefixIndex()
    index.register(IndexedInstance("md0", Tier.MD, "B"))
    return index, KVEventIngestor(index, block_size=ROUTER_BS, seed=3)


def stored(hashes: list[int], parent: int | None, tokens: list[int]) -> KVEvent:
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

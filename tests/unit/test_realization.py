"""Realized hits from KV events: the first chain position stored after the decision."""

from __future__ import annotations

import pytest

from engines_adapter.contract import KVEvent, KVEventBatch
from policies.tiers import Tier
from router.hashing import chain_hashes
from router.index.base import IndexedInstance
from router.index.memory_index import MemoryPrefixIndex
from router.kv_ingest import KVEventIngestor
from router.predictor.realization import KVRealizations

BS = 16
PROMPT = list(range(7, 7 + 10 * BS + 5))  # 10 full blocks and a partial one
CHAIN = chain_hashes(PROMPT, BS).hashes  # 11 hashes: the partial block is hashed too
OTHER = chain_hashes([t + 1000 for t in PROMPT], BS).hashes


def heard(tracker: KVRealizations, *instances: str) -> KVRealizations:
    """The instances published stored events (of another prompt) before any decision."""
    for iid in instances:
        tracker.stored(iid, UNRELATED)
    return tracker


UNRELATED = chain_hashes([t + 2000 for t in PROMPT], BS).hashes[:2]


def ingestor_for(tracker: KVRealizations) -> KVEventIngestor:
    """An ingestor over an index holding md0, telling ``tracker`` what it applies."""
    index = MemoryPrefixIndex()
    index.register(IndexedInstance("md0", Tier.MD, "B"))
    return KVEventIngestor(index, block_size=BS, observer=tracker)


def watched() -> KVRealizations:
    tracker = heard(KVRealizations(), "md0")
    tracker.begin("r1", ["md0"], CHAIN, block_size=BS, prompt_tokens=len(PROMPT))
    return tracker


def test_the_first_block_stored_after_the_decision_ends_the_hit() -> None:
    tracker = watched()
    tracker.stored("md0", CHAIN[6:10])  # the engine computed blocks 6.. itself
    tracker.stored("md0", CHAIN[4:6])  # then (e.g. a later event) 4 and 5: 4 is where it ended
    assert tracker.realized("r1", "md0") == pytest.approx(4 * BS / len(PROMPT))
    assert tracker.finish("r1") == {"md0": pytest.approx(64 / 165)}


def test_a_prefix_stored_from_block_0_is_a_miss() -> None:
    tracker = watched()
    tracker.stored("md0", CHAIN[:10])
    assert tracker.finish("r1") == {"md0": 0.0}


def test_nothing_stored_means_every_full_block_was_held() -> None:
    tracker = watched()
    # 10 full blocks of 16 over 165 tokens; the partial 11th block never counts
    assert tracker.finish("r1") == {"md0": pytest.approx(160 / 165)}


def test_an_aligned_prompt_held_whole_reports_what_the_engine_would() -> None:
    prompt = PROMPT[: 10 * BS]
    chain = chain_hashes(prompt, BS).hashes
    engine_like = heard(KVRealizations(), "md0")
    engine_like.begin("r", ["md0"], chain, block_size=BS, prompt_tokens=len(prompt))
    # the last prompt token is always computed: 9 blocks (144 tokens) cached, as vLLM says
    assert engine_like.finish("r") == {"md0": pytest.approx(0.9)}
    held = heard(KVRealizations(last_token_computed=False), "md0")
    held.begin("r", ["md0"], chain, block_size=BS, prompt_tokens=len(prompt))
    assert held.finish("r") == {"md0": 1.0}


def test_an_instance_that_never_published_a_store_tells_nothing() -> None:
    tracker = KVRealizations()  # e.g. engines without KV events, in approximate mode
    tracker.begin("r1", ["md0"], CHAIN, block_size=BS, prompt_tokens=len(PROMPT))
    assert tracker.realized("r1", "md0") is None
    assert tracker.finish("r1") == {}
    assert len(tracker) == 0


def test_other_instances_other_chains_and_earlier_stores_do_not_count() -> None:
    tracker = KVRealizations()
    tracker.stored("md0", CHAIN[:3])  # before the decision: held, a hit
    tracker.begin("r1", ["md0"], CHAIN, block_size=BS, prompt_tokens=len(PROMPT))
    tracker.begin("r2", ["md1"], OTHER, block_size=BS, prompt_tokens=len(PROMPT))
    tracker.stored("md1", CHAIN[:10])  # r1's blocks, on another instance
    tracker.stored("md0", OTHER[:10])  # another request's blocks on r1's instance
    tracker.stored("rld0", CHAIN[:10])  # an instance nobody watches
    assert tracker.realized("r1", "md0") == pytest.approx(160 / 165)
    tracker.stored("md1", OTHER[2:10])
    assert tracker.realized("r2", "md1") == pytest.approx(32 / 165)
    assert tracker.realized("r1", "md0") == pytest.approx(160 / 165)
    assert tracker.realized("r1", "md1") is None  # not watched there


def test_each_watched_instance_has_its_own_hit() -> None:
    tracker = KVRealizations()
    tracker.begin("r1", ["md0", "rld0"], CHAIN, block_size=BS, prompt_tokens=len(PROMPT))
    tracker.stored("rld0", CHAIN[1:10])
    tracker.stored("md0", CHAIN[7:10])
    assert tracker.finish("r1") == {
        "md0": pytest.approx(7 * BS / 165),
        "rld0": pytest.approx(1 * BS / 165),
    }


def test_a_request_is_forgotten_once_its_outcome_is_taken() -> None:
    tracker = watched()
    tracker.begin("r2", ["md0"], CHAIN[:5], block_size=BS, prompt_tokens=5 * BS + 3)
    assert len(tracker) == 2
    assert tracker.watched_blocks("md0") == 10
    assert tracker.finish("r1") != {}
    assert "r1" not in tracker
    assert tracker.finish("r1") == {}
    assert tracker.realized("r1", "md0") is None
    assert tracker.watched_blocks("md0") == 5  # only r2's blocks are left
    tracker.stored("md0", CHAIN[:5])  # r2's blocks, r1 no longer hears them
    assert tracker.finish("r2") == {"md0": 0.0}
    assert len(tracker) == 0
    assert tracker.watched_blocks("md0") == 0


def test_a_retry_replaces_the_watch() -> None:
    tracker = watched()
    tracker.begin("r1", ["md1"], CHAIN, block_size=BS, prompt_tokens=len(PROMPT))
    tracker.stored("md1", CHAIN[2:10])
    assert tracker.watched_blocks("md0") == 0
    assert tracker.finish("r1") == {"md1": pytest.approx(32 / 165)}


def test_the_oldest_pending_request_goes_over_the_bound() -> None:
    tracker = heard(KVRealizations(max_pending=2), "md0")
    for rid in ("a", "b", "c"):
        tracker.begin(rid, ["md0"], CHAIN, block_size=BS, prompt_tokens=len(PROMPT))
    assert len(tracker) == 2
    assert "a" not in tracker
    assert tracker.dropped == 1
    tracker.stored("md0", CHAIN[:10])
    assert tracker.finish("b") == {"md0": 0.0}
    assert tracker.finish("c") == {"md0": 0.0}
    with pytest.raises(ValueError, match="max_pending"):
        KVRealizations(max_pending=0)


def test_another_prompt_sharing_only_a_prefix_does_not_count() -> None:
    """A run ending in a block of another prompt is that prompt's prefill, not this one's."""
    shared = PROMPT[: 4 * BS] + [t + 3000 for t in PROMPT[4 * BS :]]
    theirs = chain_hashes(shared, BS).hashes
    assert theirs[:4] == CHAIN[:4]
    assert theirs[4] != CHAIN[4]
    tracker = watched()
    tracker.stored("md0", theirs[:10])  # computed after r1's decision, from block 0
    assert tracker.realized("r1", "md0") == pytest.approx(160 / 165)  # not r1's miss
    tracker.stored("md0", CHAIN[4:10])  # r1's own prefill: the shared 4 blocks were a hit
    assert tracker.finish("r1") == {"md0": pytest.approx(4 * BS / 165)}


def test_a_run_in_chunks_counts_from_its_first_chunk() -> None:
    tracker = watched()
    for start, end in ((8, 10), (6, 8), (3, 6)):  # chunks of one prefill, in any order
        tracker.stored("md0", CHAIN[start:end])
    assert tracker.finish("r1") == {"md0": pytest.approx(3 * BS / 165)}


def test_two_in_flight_requests_with_one_prefix_both_count_its_store_as_a_miss() -> None:
    """The documented caveat: a store after a request's decision is a miss for it."""
    tracker = watched()
    tracker.begin("r2", ["md0"], CHAIN, block_size=BS, prompt_tokens=len(PROMPT))
    tracker.stored("md0", CHAIN[:10])  # r1 computed the prefix; r2 may have reused it
    assert tracker.finish("r1") == {"md0": 0.0}
    assert tracker.finish("r2") == {"md0": 0.0}
    # stored before the later request's decision: a hit for it
    tracker.begin("r3", ["md0"], CHAIN, block_size=BS, prompt_tokens=len(PROMPT))
    assert tracker.finish("r3") == {"md0": pytest.approx(160 / 165)}


def test_the_ingestor_reports_stores_under_the_routers_hashes() -> None:
    """Engine blocks of 32 tokens, re-hashed into router blocks of 16, reach the tracker."""
    tracker = KVRealizations()
    ingest = ingestor_for(tracker)
    tracker.begin("r1", ["md0"], CHAIN, block_size=BS, prompt_tokens=len(PROMPT))

    def stored(hashes: list[int], parent: int | None, first: int) -> KVEventBatch:
        tokens = PROMPT[first * 32 : (first + len(hashes)) * 32]
        event = KVEvent(type="BlockStored", block_hashes=hashes, parent_block_hash=parent,
                        token_ids=tokens, block_size=32)  # fmt: skip
        return KVEventBatch(instance_id="md0", timestamp=0.0, events=[event])

    ingest.apply(stored([901, 902], None, 0))  # router blocks 0..3, before nothing: a store
    ingest.apply(stored([903, 904], 902, 2))  # router blocks 4..7
    assert isinstance(ingest.index, MemoryPrefixIndex)
    assert ingest.index.match(CHAIN)["md0"] == 8
    assert tracker.finish("r1") == {"md0": 0.0}
    tracker.begin("r2", ["md0"], CHAIN, block_size=BS, prompt_tokens=len(PROMPT))
    ingest.apply(stored([905], 904, 4))  # router blocks 8 and 9: the first new one is 8
    assert tracker.finish("r2") == {"md0": pytest.approx(8 * BS / 165)}


def test_lost_stored_events_make_the_hit_unknown_not_full() -> None:
    tracker = watched()
    tracker.begin("r2", ["md1"], CHAIN, block_size=BS, prompt_tokens=len(PROMPT))
    heard(tracker, "md1")
    tracker.lost("md0")  # e.g. a gap: r1's own stores may be among the lost events
    assert tracker.finish("r1") == {}
    assert tracker.finish("r2") == {"md1": pytest.approx(160 / 165)}  # md1 lost nothing
    tracker.begin("r3", ["md0"], CHAIN, block_size=BS, prompt_tokens=len(PROMPT))
    assert tracker.finish("r3") == {"md0": pytest.approx(160 / 165)}  # decided after it


def test_a_prompt_held_whole_stops_at_the_engines_last_full_block() -> None:
    prompt = PROMPT[: 10 * BS]  # 160 tokens: with engine blocks of 64, 128 are cached
    chain = chain_hashes(prompt, BS).hashes
    tracker = KVRealizations()
    tracker.stored("md0", UNRELATED, 64)
    tracker.begin("r", ["md0"], chain, block_size=BS, prompt_tokens=len(prompt))
    assert tracker.finish("r") == {"md0": pytest.approx(128 / 160)}


def test_the_ingestor_reports_what_it_cannot_apply_as_lost() -> None:
    tracker = watched()
    ingest = ingestor_for(tracker)
    orphan = KVEvent(
        type="BlockStored", block_hashes=[7], parent_block_hash=999,
        token_ids=PROMPT[:BS], block_size=BS,
    )  # fmt: skip
    ingest.apply(KVEventBatch(instance_id="md0", timestamp=0.0, events=[orphan]))
    assert ingest.stats.orphans == 1
    assert tracker.finish("r1") == {}
    tracker.begin("r2", ["md0"], CHAIN, block_size=BS, prompt_tokens=len(PROMPT))
    ingest.apply(KVEventBatch(instance_id="md0", timestamp=1.0, events=[], gap=True))
    assert tracker.finish("r2") == {}

"""Tenant isolation in the block hashes: cache salt, LoRA adapter, multimodal items, and the
KV-event path re-hashing engines' runs with the same keys."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from engines_adapter.contract import KVEvent, KVEventBatch
from engines_adapter.kv_events import KVEventDecoder, encode_batch
from policies.tiers import Tier
from router.hashing import HashExtras, chain_hashes
from router.index.base import IndexedInstance
from router.index.memory_index import MemoryPrefixIndex
from router.kv_ingest import KVEventIngestor, event_extras

BS = 16
tokens_st = st.lists(st.integers(0, 50_000), min_size=1, max_size=200)
salt_st = st.text(min_size=1, max_size=12)


def test_no_extras_gives_the_plain_chain() -> None:
    tokens = list(range(70))
    plain = chain_hashes(tokens, BS, 5)
    assert chain_hashes(tokens, BS, 5, extras=None) == plain
    assert chain_hashes(tokens, BS, 5, extras=HashExtras()) == plain
    assert chain_hashes(tokens, BS, 5, extras=HashExtras(cache_salt="")) == plain  # vLLM: falsy


@given(tokens_st, salt_st, salt_st, st.integers(0, 2**32))
def test_different_salts_never_share_a_block(tokens: list[int], a: str, b: str, seed: int) -> None:
    ha = chain_hashes(tokens, BS, seed, extras=HashExtras(cache_salt=a)).hashes
    hb = chain_hashes(tokens, BS, seed, extras=HashExtras(cache_salt=b)).hashes
    plain = chain_hashes(tokens, BS, seed).hashes
    assert ha == chain_hashes(tokens, BS, seed, extras=HashExtras(cache_salt=a)).hashes
    assert set(ha).isdisjoint(plain)
    if a != b:
        assert set(ha).isdisjoint(hb)
    else:
        assert ha == hb


@given(tokens_st, salt_st, salt_st)
def test_different_adapters_never_share_a_block(tokens: list[int], a: str, b: str) -> None:
    ha = chain_hashes(tokens, BS, extras=HashExtras(lora_name=a)).hashes
    hb = chain_hashes(tokens, BS, extras=HashExtras(lora_name=b)).hashes
    assert set(ha).isdisjoint(chain_hashes(tokens, BS).hashes)
    assert (ha == hb) if a == b else set(ha).isdisjoint(hb)


def test_salted_prompts_keep_the_prefix_property() -> None:
    extras = HashExtras(cache_salt="tenant-a", lora_name="sql")
    short = chain_hashes(list(range(40)), BS, extras=extras).hashes
    long = chain_hashes(list(range(100)), BS, extras=extras).hashes
    assert long[:2] == short[:2]  # the full blocks of the shorter prompt
    assert long[2] != short[2]  # its partial block is not the longer one's full block


@given(tokens_st, st.integers(1, 199), salt_st, st.none() | salt_st)
def test_continuing_from_a_parent_matches_hashing_whole(
    tokens: list[int], cut_at: int, salt: str, lora: str | None
) -> None:
    """The salt goes into the first block only, the adapter into every one: a piece
    hashed from its parent continues the salted chain exactly."""
    extras = HashExtras(cache_salt=salt, lora_name=lora)
    whole = chain_hashes(tokens, BS, extras=extras).hashes
    cut = min(cut_at // BS * BS, (len(tokens) - 1) // BS * BS)
    if cut == 0:
        return
    head = chain_hashes(tokens[:cut], BS, extras=extras).hashes
    tail = chain_hashes(tokens[cut:], BS, parent=head[-1], extras=extras).hashes
    assert head + tail == whole


def test_multimodal_items_change_only_the_blocks_they_overlap_and_later() -> None:
    tokens = [7] * 80  # placeholder tokens look alike; the identifier tells items apart
    a = chain_hashes(tokens, BS, extras=HashExtras(mm=(("img-a", 20, 20),))).hashes
    b = chain_hashes(tokens, BS, extras=HashExtras(mm=(("img-b", 20, 20),))).hashes
    moved = chain_hashes(tokens, BS, extras=HashExtras(mm=(("img-a", 21, 20),))).hashes
    plain = chain_hashes(tokens, BS).hashes
    assert a[0] == b[0] == plain[0]  # block 0 holds no placeholder
    assert all(x != y for x, y in zip(a[1:], b[1:], strict=True))
    assert a[1] != moved[1]  # the offset within the block counts, as in vLLM


# --------------------------------------------------------------------------- KV events

ENGINE_BS = 32


def _ingest() -> tuple[MemoryPrefixIndex, KVEventIngestor]:
    index = MemoryPrefixIndex()
    index.register(IndexedInstance("md0", Tier.MD, "B"))
    return index, KVEventIngestor(index, block_size=BS, seed=3)


def _stored(hashes: list[int], parent: int | None, tokens: list[int],
            lora: str | None, keys: list[list[object] | None] | None) -> KVEvent:  # fmt: skip
    return KVEvent(
        type="BlockStored", block_hashes=hashes, parent_block_hash=parent, token_ids=tokens,
        block_size=ENGINE_BS, lora_name=lora, extra_keys=keys,
    )  # fmt: skip


def test_vllm_wire_fields_lora_name_and_extra_keys_decode() -> None:
    raw = ["BlockStored", [1, 2], None, list(range(64)), 32, None, "GPU", "sql",
           [("sql", "salt-1"), ("sql",)]]  # fmt: skip
    payload = msgspec.msgpack.encode([0.0, [raw]])
    (event,) = KVEventDecoder("md0").decode(payload).events
    assert event.lora_name == "sql"
    assert event.extra_keys == [["sql", "salt-1"], ["sql"]]
    again = KVEventDecoder("md0").decode(encode_batch([event], form="array")).events
    assert again == [event]
    assert event_extras(event) == HashExtras(cache_salt="salt-1", lora_name="sql")


def test_salted_runs_from_events_match_only_the_same_tenants_prompt() -> None:
    index, ingest = _ingest()
    prompt = list(range(100, 100 + 4 * ENGINE_BS))
    first = _stored([11, 12], None, prompt[: 2 * ENGINE_BS], None, [["salt-a"], None])
    second = _stored([13, 14], 12, prompt[2 * ENGINE_BS :], None, None)
    ingest.apply(KVEventBatch(instance_id="md0", timestamp=0.0, events=[first, second]))
    salted = chain_hashes(prompt, BS, 3, extras=HashExtras(cache_salt="salt-a")).hashes
    other = chain_hashes(prompt, BS, 3, extras=HashExtras(cache_salt="salt-b")).hashes
    assert index.match(salted) == {"md0": 8}
    assert index.match(other).get("md0", 0) == 0
    assert index.match(chain_hashes(prompt, BS, 3).hashes).get("md0", 0) == 0


def test_adapter_runs_from_events_match_the_adapters_prompt() -> None:
    index, ingest = _ingest()
    prompt = list(range(2 * ENGINE_BS))
    event = _stored([1, 2], None, prompt, "sql", [["sql"], ["sql"]])
    ingest.apply(KVEventBatch(instance_id="md0", timestamp=0.0, events=[event]))
    assert index.match(chain_hashes(prompt, BS, 3, extras=HashExtras(lora_name="sql")).hashes) == {
        "md0": 4
    }
    assert index.match(chain_hashes(prompt, BS, 3).hashes).get("md0", 0) == 0


def test_multimodal_runs_are_not_guessed() -> None:
    _index, ingest = _ingest()
    event = _stored([1], None, list(range(ENGINE_BS)), None, [[["img", 4]]])
    ingest.apply(KVEventBatch(instance_id="md0", timestamp=0.0, events=[event]))
    assert ingest.stats.unhashable == 1
    assert ingest.stats.stored_blocks == 0

"""The KV relay's wire format: round trips, and malformed or garbled payloads refused."""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.hashing import chain_hashes
from router.kv_relay.relay import split_batch
from router.kv_relay.wire import (
    Hashing,
    HashingMismatch,
    RelayDecoder,
    RelayedBatch,
    RelayedEvent,
    RelayKind,
    encode_relayed,
    pack_hashes,
)

BS = 16
HASHING = Hashing(BS, 0)
U64_MAX = (1 << 64) - 1


def _roundtrip(events: list[RelayedEvent]) -> RelayedBatch:
    return RelayDecoder().decode(
        encode_relayed(events, timestamp=12.5, hashing=HASHING), sequence=7
    )


# -- the encoding ------------------------------------------------------------------------


def test_every_kind_round_trips_with_hashes_at_both_ends_of_64_bits() -> None:
    events = [
        RelayedEvent(RelayKind.STORED, "md0", (0, 1, U64_MAX, 0x8000_0000_0000_0000), 16),
        RelayedEvent(RelayKind.STORED, "md1", (42,), None),
        RelayedEvent(RelayKind.REMOVED, "md0", (U64_MAX,)),
        RelayedEvent(RelayKind.LOST, "md1"),
        RelayedEvent(RelayKind.CLEARED, "md0"),
    ]
    batch = _roundtrip(events)
    assert batch.events == events
    assert (batch.timestamp, batch.sequence, batch.gap) == (12.5, 7, False)
    assert batch.instances == ("md0", "md1")  # each named once


def test_a_stored_block_costs_eight_bytes_and_no_token_ids() -> None:
    """64 blocks of one run: 8 bytes each, plus a few bytes for the event and the batch."""
    blocks = tuple(chain_hashes(list(range(64 * BS)), BS).hashes)
    one = len(encode_relayed([RelayedEvent(RelayKind.STORED, "md0", blocks, BS)], hashing=HASHING))
    assert 64 * 8 < one < 64 * 8 + 40


@given(
    st.lists(
        st.tuples(
            st.sampled_from(list(RelayKind)),
            st.sampled_from(["md0", "md-1", "b:md.2"]),
            st.lists(st.integers(0, U64_MAX), max_size=20),
            st.one_of(st.none(), st.integers(1, 4096)),
        ),
        max_size=30,
    )
)
@settings(max_examples=60, deadline=None)
def test_any_events_round_trip(raw: list[tuple[RelayKind, str, list[int], int | None]]) -> None:
    events = []
    for kind, iid, blocks, size in raw:
        if kind == RelayKind.STORED:
            events.append(RelayedEvent(kind, iid, tuple(blocks), size))
        elif kind == RelayKind.REMOVED:
            events.append(RelayedEvent(kind, iid, tuple(blocks)))
        else:
            events.append(RelayedEvent(kind, iid))
    assert _roundtrip(events).events == events


# -- the relay end to end, without sockets -------------------------------------------------


_enc = msgspec.msgpack.encode
H = [BS, 0]
_GOOD = [2, 0.0, H, ["md0"], [[0, 0, pack_hashes([1, 2]), 16]]]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\xc1", "not valid msgpack"),
        (_enc({"ts": 1}), "must be a list"),
        (_enc([1, 0.0, ["md0"], []]), "format 1, not 2: the relay and this side run"),
        (_enc([3, *_GOOD[1:]]), "format 3"),
        (_enc(_GOOD[:4]), "must be [version"),
        (_enc([True, *_GOOD[1:]]), "format True"),
        (_enc([2, "now", H, ["md0"], []]), "timestamp"),
        (_enc([2, 0.0, [16], ["md0"], []]), "hashing must be"),
        (_enc([2, 0.0, [0, 0], ["md0"], []]), "hashing must be"),
        (_enc([2, 0.0, [16, -1], ["md0"], []]), "hashing must be"),
        (_enc([2, 0.0, [16, True], ["md0"], []]), "hashing must be"),
        (_enc([2, 0.0, H, ["md 0"], []]), "instance ids"),
        (_enc([2, 0.0, H, ["x" * 65], []]), "instance ids"),
        (_enc([2, 0.0, H, [7], []]), "instance ids"),
        (_enc([2, 0.0, H, ["md0"], {}]), "events must be a list"),
        (_enc([2, 0.0, H, ["md0"], [[9, 0]]]), "unknown kind"),
        (_enc([2, 0.0, H, ["md0"], [[True, 0]]]), "unknown kind"),
        (_enc([2, 0.0, H, ["md0"], [[2, 1]]]), "names instance 1"),
        (_enc([2, 0.0, H, ["md0"], [[2, -1]]]), "names instance -1"),
        (_enc([2, 0.0, H, ["md0"], [[0, 0, b"\x00" * 7, 16]]]), "multiple of 8"),
        (_enc([2, 0.0, H, ["md0"], [[0, 0, [1, 2], 16]]]), "msgpack binary"),
        (_enc([2, 0.0, H, ["md0"], [[0, 0, b"", 0]]]), "positive integer"),
        (_enc([2, 0.0, H, ["md0"], [[0, 0, b""]]]), "4 fields"),
        (_enc([2, 0.0, H, ["md0"], [[2, 0, b""]]]), "2 fields"),
        (_enc([2, 0.0, H, ["md0"], [0, 0]]), "must be [kind"),
        (
            _enc([2, 0.0, H, ["md0"], [[0, 0, b"\x00" * 80, 16]] * 3]),
            "30 blocks, over the limit of 20",
        ),
    ],
)
def test_malformed_payloads_are_refused_with_a_value_error(payload: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        RelayDecoder(max_blocks=20).decode(payload)


def test_a_batch_hashed_under_other_parameters_is_refused_naming_both() -> None:
    """A relay run with another block size or seed than the routers' would fill their
    index with blocks no prompt of theirs can match: refused, with the settings to fix."""
    events = [RelayedEvent(RelayKind.STORED, "md0", (1, 2), 32)]
    for sent in (Hashing(32, 0), Hashing(BS, 7)):
        payload = encode_relayed(events, hashing=sent)
        with pytest.raises(HashingMismatch) as refused:
            RelayDecoder(expect=HASHING).decode(payload)
        assert refused.value.sent == sent
        message = str(refused.value)
        assert sent.describe() in message
        assert HASHING.describe() in message
        assert "PDD_ROUTER_BLOCK_SIZE" in message
        assert RelayDecoder().decode(payload).events == events  # no expectation: accepted
    assert RelayDecoder(expect=HASHING).decode(
        encode_relayed(events, hashing=HASHING)).events == events  # fmt: skip


def test_garbled_payloads_raise_value_error_and_nothing_else() -> None:
    """Every byte flipped, truncated or inserted at random in a good payload: each decode
    either succeeds or raises ValueError (what the subscriber skips), never anything else."""
    good = encode_relayed(
        [RelayedEvent(RelayKind.STORED, "md0", (1, 2, 3), 16),
         RelayedEvent(RelayKind.REMOVED, "md1", (4,)), RelayedEvent(RelayKind.CLEARED, "md0")],
        hashing=HASHING,
    )  # fmt: skip
    rng = random.Random(5)
    decoder = RelayDecoder()
    refused = 0
    for _ in range(3000):
        data = bytearray(good)
        at = rng.randrange(len(data))
        choice = rng.randrange(3)
        if choice == 0:
            data[at] = rng.randrange(256)
        elif choice == 1:
            del data[at:]
        else:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        try:
            decoder.decode(bytes(data))
        except ValueError:
            refused += 1
    assert refused > 1000


def test_deeply_nested_payloads_raise_value_error() -> None:
    """msgpack nested past msgspec's recursion limit (a few KB of bytes) is malformed
    input, refused like any other, not a RecursionError that ends the subscription."""
    for prefix in (b"\x91", b"\x81\x01"):  # arrays in arrays, maps in maps
        with pytest.raises(ValueError, match="not valid msgpack"):
            RelayDecoder().decode(prefix * 5000 + b"\xc0")


# -- bounded batches -------------------------------------------------------------------


def test_a_batch_over_the_block_limit_is_refused_naming_the_limit_before_any_is_unpacked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """70,000 blocks against the default limit of 65,536: refused with the limit and the
    setting named, without unpacking a single block."""
    import router.kv_relay.wire as wire

    def unpacked(data: bytes) -> tuple[int, ...]:
        raise AssertionError("a block was unpacked")

    big = [RelayedEvent(RelayKind.STORED, "md0", tuple(range(35_000)), 16)] * 2
    payload = encode_relayed(big, hashing=HASHING)
    monkeypatch.setattr(wire, "unpack_hashes", unpacked)
    decoder = RelayDecoder(limit_name="PDD_ROUTER_SERVICE__MAX_KV_RELAY_BATCH_BLOCKS")
    with pytest.raises(ValueError, match="70000 blocks, over the limit of 65536") as refused:
        decoder.decode(payload)
    assert "PDD_ROUTER_SERVICE__MAX_KV_RELAY_BATCH_BLOCKS" in str(refused.value)


def test_a_payload_too_large_for_the_limit_is_refused_unparsed() -> None:
    """Many blockless events: the bytes alone exceed what 20 blocks may take."""
    payload = _enc([2, 0.0, [BS, 0], ["md0"], [[2, 0]] * 400_000])
    with pytest.raises(ValueError, match="bytes, over the limit of 20 blocks"):
        RelayDecoder(max_blocks=20).decode(payload)


def test_the_relay_splits_what_is_pending_into_batches_a_receiver_accepts() -> None:
    """Runs of 3, 12 and 5 blocks and a clear, at most 5 blocks a batch: the 12-block run
    is cut into consecutive pieces, the order and every block kept."""
    events = [
        RelayedEvent(RelayKind.STORED, "md0", tuple(range(3)), 16),
        RelayedEvent(RelayKind.STORED, "md1", tuple(range(100, 112)), 16),
        RelayedEvent(RelayKind.CLEARED, "md2"),
        RelayedEvent(RelayKind.REMOVED, "md0", tuple(range(5))),
    ]
    batches = list(split_batch(events, 5))
    assert [sum(len(e.blocks) for e in b) for b in batches] == [3, 5, 5, 2, 5]
    flat = [e for b in batches for e in b]
    assert [b for e in flat if e.instance_id == "md1" for b in e.blocks] == list(range(100, 112))
    assert [e.kind for e in flat] == [RelayKind.STORED] * 4 + [RelayKind.CLEARED, RelayKind.REMOVED]
    for batch in batches:  # each accepted by a receiver with that limit
        RelayDecoder(max_blocks=5).decode(encode_relayed(batch, hashing=HASHING))

"""KV-event decoding (map and tagged-array forms), encoding, and the subscriber's gap handling."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
import pytest
import zmq
import zmq.asyncio

from engines_adapter.contract import KVEvent, KVEventBatch
from engines_adapter.kv_events import (
    KVEventDecoder,
    decode_sequence,
    encode_batch,
    encode_frames,
)
from engines_adapter.kv_publisher import KVEventPublisher
from engines_adapter.kv_subscriber import KVEventSubscriber

pack = msgspec.msgpack.encode

STORED_MAP = {
    "type": "BlockStored",
    "block_hashes": [11, 12],
    "parent_block_hash": None,
    "token_ids": list(range(8)),
    "block_size": 4,
    "lora_id": None,
    "medium": "GPU",
    "lora_name": None,
}
STORED_ARRAY = ["BlockStored", [11, 12], None, list(range(8)), 4, None, "GPU"]


def test_map_and_array_forms_decode_to_the_same_events() -> None:
    decoder = KVEventDecoder("i0")
    from_map = decoder.decode(
        pack([1.5, [STORED_MAP, {"type": "BlockRemoved", "block_hashes": [12]}]])
    )
    from_array = decoder.decode(pack([1.5, [STORED_ARRAY, ["BlockRemoved", [12], None]]]))
    assert from_map.events == from_array.events
    stored, removed = from_map.events
    assert stored == KVEvent(
        type="BlockStored", block_hashes=[11, 12], token_ids=list(range(8)), block_size=4
    )
    assert removed.type == "BlockRemoved"
    assert removed.block_hashes == [12]
    assert from_map.timestamp == 1.5
    assert from_map.instance_id == "i0"


def test_all_blocks_cleared_and_trailing_batch_fields() -> None:
    batch = KVEventDecoder("i0").decode(pack([2, [["AllBlocksCleared"]], 0]))  # dp rank 0
    assert [e.type for e in batch.events] == ["AllBlocksCleared"]


def test_bytes_hashes_become_hex_and_parent_is_kept() -> None:
    event = {"type": "BlockStored", "block_hashes": [b"\x01\xff"], "parent_block_hash": 7,
             "token_ids": [1, 2], "block_size": 2}  # fmt: skip
    (decoded,) = KVEventDecoder("i0").decode(pack([0.0, [event]])).events
    assert decoded.block_hashes == ["01ff"]
    assert decoded.parent_block_hash == 7


def test_unknown_event_types_are_skipped_and_counted() -> None:
    decoder = KVEventDecoder("i0")
    batch = decoder.decode(pack([0.0, [{"type": "BlockPinned", "x": 1}, ["Mystery"], STORED_MAP]]))
    assert [e.type for e in batch.events] == ["BlockStored"]
    assert decoder.unknown_events == 2
    assert decoder.unknown_types == {"BlockPinned", "Mystery"}


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\xc1not msgpack", "not valid msgpack"),
        (pack({"nope": 1}), "timestamp must be a number"),
        (pack([1.0]), "must be"),
        (pack(["soon", []]), "timestamp"),
        (pack([1.0, {"a": 1}]), "events must be a list"),
        (pack([1.0, [42]]), "map or a tagged array"),
        (pack([1.0, [{"block_hashes": [1]}]]), "type tag"),
        (pack([1.0, [{"type": "BlockStored", "token_ids": [1]}]]), "without block_hashes"),
        (pack([1.0, [["BlockStored", [1.5], None, [1], 1]]]), "block hash"),
        (pack([1.0, [["BlockStored", [1], None, ["a"], 1]]]), "list of integers"),
        (b"\x91" * 5000 + b"\xc0", "not valid msgpack"),  # past msgspec's recursion limit
        (b"\x81\x01" * 5000 + b"\xc0", "not valid msgpack"),
    ],
)
def test_malformed_payloads_raise_a_clear_value_error(payload: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KVEventDecoder("i0").decode(payload)


@pytest.mark.parametrize("form", ["map", "array"])
def test_encoder_round_trips_through_the_decoder(form: str) -> None:
    events = [
        KVEvent(type="BlockStored", block_hashes=[1, 2], parent_block_hash=9,
                token_ids=[5, 6, 7, 8], block_size=2),
        KVEvent(type="BlockRemoved", block_hashes=[1]),
        KVEvent(type="AllBlocksCleared"),
    ]  # fmt: skip
    frames = encode_frames(41, encode_batch(events, timestamp=3.0, form=form), topic=b"kv")  # type: ignore[arg-type]
    batch = KVEventDecoder("i0").decode_frames(frames)
    assert batch.events == events
    assert batch.sequence == 41
    assert frames[0] == b"kv"
    assert frames[1] == (41).to_bytes(8, "big")


def test_sequence_frames() -> None:
    assert decode_sequence((2**40).to_bytes(8, "big")) == 2**40
    assert decode_sequence(b"\xff" * 8) == -1  # vLLM's end-of-replay marker
    with pytest.raises(ValueError, match="8 bytes"):
        decode_sequence(b"\x00\x01")
    with pytest.raises(ValueError, match="frames"):
        KVEventDecoder("i0").decode_frames([b"only one"])


# -- the subscriber, against a raw PUB socket we control -------------------------------


@pytest.fixture
async def pub() -> AsyncIterator[tuple[zmq.asyncio.Socket, str]]:
    context = zmq.asyncio.Context()
    sock = context.socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:*")
    yield sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)
    sock.close(linger=0)
    context.term()


STORED = KVEvent(type="BlockStored", block_hashes=[1], token_ids=[1, 2], block_size=2)


async def _send(sock: zmq.asyncio.Socket, seq: int) -> None:
    await sock.send_multipart(encode_frames(seq, encode_batch([STORED], timestamp=float(seq))))


class Tap:
    """Runs a subscriber in a task and queues what it yields (cancel-safe waiting)."""

    def __init__(self, subscriber: KVEventSubscriber) -> None:
        self.subscriber = subscriber
        self.queue: asyncio.Queue[KVEventBatch] = asyncio.Queue()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for batch in self.subscriber.batches():
            await self.queue.put(batch)

    async def get(self, timeout: float = 5.0) -> KVEventBatch:
        return await asyncio.wait_for(self.queue.get(), timeout)

    async def connect(self, probe: Callable[[], Awaitable[object]]) -> None:
        """Probe until one is heard (ZMQ's slow joiner), then drop whatever probes arrived."""
        async with asyncio.timeout(10):
            while True:
                await probe()
                with contextlib.suppress(TimeoutError):
                    await self.get(0.05)
                    break
        await asyncio.sleep(0.1)
        while not self.queue.empty():
            self.queue.get_nowait()

    async def aclose(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        self.subscriber.close()


@pytest.fixture
async def tap(pub: tuple[zmq.asyncio.Socket, str]) -> AsyncIterator[Tap]:
    sock, endpoint = pub
    tap = Tap(KVEventSubscriber("i0", endpoint))
    await tap.connect(lambda: _send(sock, 0))
    yield tap
    await tap.aclose()


async def test_subscriber_marks_a_sequence_gap_with_a_leading_clear(
    pub: tuple[zmq.asyncio.Socket, str], tap: Tap
) -> None:
    sock, _ = pub
    for seq in (1, 4):
        await _send(sock, seq)
    in_order, after_gap = await tap.get(), await tap.get()
    assert (in_order.sequence, in_order.gap) == (1, False)
    assert (after_gap.sequence, after_gap.gap, after_gap.missed) == (4, True, 2)
    assert [e.type for e in after_gap.events] == ["AllBlocksCleared", "BlockStored"]


async def test_subscriber_treats_a_sequence_going_back_as_a_publisher_restart(
    pub: tuple[zmq.asyncio.Socket, str], tap: Tap
) -> None:
    sock, _ = pub
    for seq in (1, 0):
        await _send(sock, seq)
    first, restarted = await tap.get(), await tap.get()
    assert not first.gap
    assert (restarted.gap, restarted.missed) == (True, 0)
    assert restarted.events[0].type == "AllBlocksCleared"


async def test_a_dropped_connection_counts_as_a_gap_though_the_sequence_looks_unbroken() -> None:
    """A publisher restarted on the same port whose first batch the subscriber hears has
    the next sequence number: its earlier batches were lost while the subscriber was away,
    so the instance's cache is cleared rather than trusted."""
    context = zmq.asyncio.Context()
    first = context.socket(zmq.PUB)
    first.setsockopt(zmq.LINGER, 0)
    first.bind("tcp://127.0.0.1:*")
    endpoint = first.getsockopt_string(zmq.LAST_ENDPOINT)
    tap = Tap(KVEventSubscriber("i0", endpoint))
    try:
        await tap.connect(lambda: _send(first, 0))
        await _send(first, 1)
        assert (await tap.get()).gap is False
        first.close(linger=0)  # the engine dies; a new one binds the same port
        second = context.socket(zmq.PUB)
        second.setsockopt(zmq.LINGER, 0)
        try:
            async with asyncio.timeout(10):  # ZMQ releases the port in the background
                while True:
                    try:
                        second.bind(endpoint)
                        break
                    except zmq.ZMQError:
                        await asyncio.sleep(0.05)
            # sequence 2 again and again until the subscriber is back: what it hears first
            # looks unbroken, so only the dropped connection can mark it as a gap
            async with asyncio.timeout(10):
                while True:
                    await _send(second, 2)
                    with contextlib.suppress(TimeoutError):
                        after = await tap.get(0.05)
                        break
            assert after.sequence == 2
            assert after.gap is True
            assert after.events[0].type == "AllBlocksCleared"
            assert tap.subscriber.gaps == 1
        finally:
            second.close(linger=0)
    finally:
        await tap.aclose()
        context.destroy(linger=0)


async def test_subscriber_skips_a_malformed_message_and_reports_the_loss(
    pub: tuple[zmq.asyncio.Socket, str], tap: Tap
) -> None:
    sock, _ = pub
    await _send(sock, 1)
    await sock.send_multipart([b"", (2).to_bytes(8, "big"), b"\xc1garbage"])
    await _send(sock, 3)
    first, after = await tap.get(), await tap.get()
    assert not first.gap
    assert (after.sequence, after.gap, after.missed) == (3, True, 1)
    assert tap.subscriber.malformed == 1


async def test_subscriber_fills_a_gap_from_the_replay_socket() -> None:
    publisher = KVEventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")
    tap = Tap(
        KVEventSubscriber("i0", publisher.endpoint, replay_endpoint=publisher.replay_endpoint)
    )
    batch = KVEventBatch(instance_id="x", timestamp=0.0, events=[STORED])
    try:
        await tap.connect(lambda: publisher.publish(batch))
        # Two batches the subscriber never hears: in the replay buffer, not on the PUB socket.
        lost = publisher.next_sequence
        publisher._buffer.append((lost, encode_batch([STORED], timestamp=1.0)))
        publisher._buffer.append((lost + 1, encode_batch([STORED], timestamp=2.0)))
        publisher._sequence += 2
        await publisher.publish(batch)
        got = [await tap.get() for _ in range(3)]
    finally:
        await tap.aclose()
        await publisher.aclose()
    assert [b.sequence for b in got] == [lost, lost + 1, lost + 2]
    assert not any(b.gap for b in got)
    assert tap.subscriber.gaps == 0


async def test_an_oversized_message_drops_the_connection_and_counts_as_a_gap(
    pub: tuple[zmq.asyncio.Socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message above MAX_MESSAGE_BYTES is never decoded: ZMQ drops the connection, and
    what comes after it is a gap (the instance is cleared)."""
    from engines_adapter import kv_subscriber

    monkeypatch.setattr(kv_subscriber, "MAX_MESSAGE_BYTES", 4096)
    sock, endpoint = pub
    tap = Tap(KVEventSubscriber("i0", endpoint))
    try:
        await tap.connect(lambda: _send(sock, 0))
        await _send(sock, 1)
        assert (await tap.get()).gap is False
        await sock.send_multipart([b"", (2).to_bytes(8, "big"), b"\x00" * 100_000])
        async with asyncio.timeout(10):  # the subscriber reconnects within half a second
            while True:
                await _send(sock, 3)
                with contextlib.suppress(TimeoutError):
                    after = await tap.get(0.05)
                    break
        assert after.gap is True
        assert after.events[0].type == "AllBlocksCleared"
        assert tap.subscriber.malformed == 0  # refused by ZMQ, not decoded
    finally:
        await tap.aclose()


async def test_the_replay_buffer_keeps_the_latest_batches_within_its_bytes() -> None:
    publisher = KVEventPublisher("tcp://127.0.0.1:*", buffer_batches=100, buffer_bytes=1000)
    try:
        for i in range(10):
            await publisher.publish_payload(bytes([i]) * 300)
    finally:
        await publisher.aclose()
    kept = list(publisher._buffer)
    assert [seq for seq, _ in kept] == [7, 8, 9]  # 900 bytes; a fourth would be 1,200
    assert all(payload == bytes([seq]) * 300 for seq, payload in kept)

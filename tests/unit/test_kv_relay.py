"""The KV relay at work: what a router's index ends up with through it, gaps and replay
on the relayed stream, a dead connection, hostile messages skipped, failures recovered
(the wire format and the settings have their own files)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from engines_adapter.contract import KVEvent, KVEventBatch
from engines_adapter.kv_events import with_gap
from engines_adapter.kv_publisher import KVEventPublisher
from policies.tiers import Tier
from router.hashing import chain_hashes
from router.index.base import IndexedInstance
from router.index.memory_index import MemoryPrefixIndex
from router.kv_ingest import KVEventIngestor
from router.kv_relay.receiver import RelaySubscriber, apply_relayed, by_instance
from router.kv_relay.relay import KVRelay
from router.kv_relay.settings import KVRelaySource
from router.kv_relay.wire import (
    Hashing,
    RelayDecoder,
    RelayedBatch,
    RelayedEvent,
    RelayKind,
    encode_relayed,
)

BS = 16
HASHING = Hashing(BS, 0)


class Captured:
    """Stands for the publisher: keeps the payloads and numbers them."""

    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    async def publish_payload(self, payload: bytes) -> int:
        self.payloads.append(payload)
        return len(self.payloads) - 1


def _stored(tokens: list[int], hashes: list[int | str], parent: int | str | None) -> KVEvent:
    return KVEvent(type="BlockStored", block_hashes=hashes, parent_block_hash=parent,
                   token_ids=tokens, block_size=BS)  # fmt: skip


def _index() -> MemoryPrefixIndex:
    index = MemoryPrefixIndex()
    for iid in ("md0", "md1"):
        index.register(IndexedInstance(iid, Tier.MD, "B"))
    return index


async def test_an_index_fed_through_the_relay_matches_one_fed_directly() -> None:
    """Stored runs continuing a parent, a removal by engine hash, a gap on an engine's
    stream, two instances: the relayed index answers every match as the direct one."""
    prompt = [(7 * i + 3) % 50_000 for i in range(8 * BS)]
    other = [(11 * i + 5) % 50_000 for i in range(4 * BS)]
    batches = [
        KVEventBatch(instance_id="md0", timestamp=1.0, events=[
            _stored(prompt[: 4 * BS], [10, 11, 12, 13], None),
            _stored(prompt[4 * BS :], [14, 15, 16, 17], 13),
        ]),
        KVEventBatch(instance_id="md1", timestamp=1.0, events=[
            _stored(other, ["aa", "bb", "cc", "dd"], None),
        ]),
        KVEventBatch(instance_id="md0", timestamp=2.0, events=[
            KVEvent(type="BlockRemoved", block_hashes=[17, 16, 999]),
        ]),
        with_gap(KVEventBatch(instance_id="md1", timestamp=3.0, events=[
            _stored(other[: 2 * BS], ["ee", "ff"], None),
        ]), missed=2),
    ]  # fmt: skip
    direct = _index()
    ingest = KVEventIngestor(direct, block_size=BS)
    relayed = _index()
    receive = KVEventIngestor(relayed, block_size=BS)
    relay = KVRelay(Captured(), {}, block_size=BS)  # type: ignore[arg-type]
    for batch in batches:
        ingest.apply(batch)
        relay.accept(batch)
        if batch.timestamp != 1.0:  # three engine batches in one relayed batch, then one
            await relay.flush()
    captured = relay.publisher
    assert isinstance(captured, Captured)
    assert len(captured.payloads) == 2
    for payload in captured.payloads:
        for events in by_instance(RelayDecoder().decode(payload)).values():
            apply_relayed(receive, events)
    for tokens in (prompt, prompt[: 5 * BS], other, other[: 2 * BS]):
        chain = chain_hashes(tokens, BS).hashes
        assert relayed.match(chain) == direct.match(chain)
    assert direct.match(chain_hashes(prompt, BS).hashes)["md0"] == 6
    assert direct.match(chain_hashes(other, BS).hashes)["md1"] == 2  # cleared, then 2 again
    assert relay.stats.blocks_out == 8 + 4 + 2 + 2
    assert (receive.stats.stored_blocks, receive.stats.removed_blocks) == (14, 2)
    assert receive.stats.clears == 1


# -- gaps on the relayed stream --------------------------------------------------------


SOURCE_INSTANCES = ["md0", "md1"]


async def _relayed(publisher: KVEventPublisher, blocks: tuple[int, ...] = (1, 2)) -> int:
    event = RelayedEvent(RelayKind.STORED, "md0", blocks, BS)
    return await publisher.publish_payload(encode_relayed([event], hashing=HASHING))


class Tap:
    def __init__(self, subscriber: RelaySubscriber) -> None:
        self.subscriber = subscriber
        self.queue: asyncio.Queue[RelayedBatch] = asyncio.Queue()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for batch in self.subscriber.batches():
            await self.queue.put(batch)

    async def get(self, timeout: float = 5.0) -> RelayedBatch:
        return await asyncio.wait_for(self.queue.get(), timeout)

    async def aclose(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        self.subscriber.close()


async def _until_heard(publisher: KVEventPublisher, tap: Tap) -> None:
    """Publish until the subscription hears a batch (a slow joiner misses the first ones)."""
    async with asyncio.timeout(10):
        while True:
            await _relayed(publisher)
            with contextlib.suppress(TimeoutError):
                await tap.get(0.05)
                return


@contextlib.asynccontextmanager
async def relay_and_tap(*, replay: bool) -> AsyncIterator[tuple[KVEventPublisher, Tap]]:
    publisher = KVEventPublisher(
        "tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*" if replay else None
    )
    source = KVRelaySource(endpoint=publisher.endpoint, instances=SOURCE_INSTANCES,
                           replay_endpoint=publisher.replay_endpoint)  # fmt: skip
    tap = Tap(RelaySubscriber(source, hashing=HASHING))
    try:
        await _until_heard(publisher, tap)
        await asyncio.sleep(0.1)
        while not tap.queue.empty():
            tap.queue.get_nowait()
        yield publisher, tap
    finally:
        await tap.aclose()
        await publisher.aclose()


def _skip(publisher: KVEventPublisher, n: int, *, keep: bool) -> None:
    """``n`` batches the subscriber never hears (in the replay buffer if ``keep``)."""
    for _ in range(n):
        seq = publisher._sequence
        if keep:
            payload = encode_relayed(
                [RelayedEvent(RelayKind.STORED, "md1", (seq,), BS)], hashing=HASHING
            )
            publisher._buffer.append((seq, payload))
        publisher._sequence += 1


async def test_a_gap_on_the_relayed_stream_clears_every_instance_the_relay_covers() -> None:
    async with relay_and_tap(replay=False) as (publisher, tap):
        await _relayed(publisher)
        _skip(publisher, 3, keep=False)
        await _relayed(publisher, (5,))
        in_order, after = await tap.get(), await tap.get()
    assert not in_order.gap
    assert (after.gap, after.missed) == (True, 3)
    lead = [(e.kind, e.instance_id) for e in after.events[:4]]
    assert lead == [(RelayKind.LOST, "md0"), (RelayKind.CLEARED, "md0"),
                    (RelayKind.LOST, "md1"), (RelayKind.CLEARED, "md1")]  # fmt: skip
    assert after.events[4].blocks == (5,)
    assert tap.subscriber.gaps == 1


async def test_batches_hashed_under_other_parameters_are_refused_then_the_next_is_a_gap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A relay started with another block size: none of its batches reach the index, the
    log says which settings differ (once per doubling, not once per batch), and once it
    hashes as the routers do its first batch comes as a gap, clearing what it covers."""
    async with relay_and_tap(replay=False) as (publisher, tap):
        wrong = [RelayedEvent(RelayKind.STORED, "md0", (1, 2), 32)]
        with caplog.at_level(logging.WARNING):
            for _ in range(5):
                await publisher.publish_payload(encode_relayed(wrong, hashing=Hashing(32, 0)))
            await _relayed(publisher, (5,))
            after = await tap.get()
    assert tap.queue.empty()
    assert tap.subscriber.malformed == 5
    refusals = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert len(refusals) == 3  # the 1st, 2nd and 4th
    assert "blocks of 32 tokens, hash seed 0, this side blocks of 16 tokens" in refusals[0]
    assert (after.gap, after.missed) == (True, 5)
    assert [e.kind for e in after.events[:2]] == [RelayKind.LOST, RelayKind.CLEARED]
    assert after.events[-1].blocks == (5,)


async def test_a_gap_is_filled_from_the_relays_replay_socket() -> None:
    async with relay_and_tap(replay=True) as (publisher, tap):
        _skip(publisher, 2, keep=True)
        last = await _relayed(publisher, (9,))
        got = [await tap.get() for _ in range(3)]
    assert [b.sequence for b in got] == [last - 2, last - 1, last]
    assert not any(b.gap for b in got)
    assert [b.events[0].instance_id for b in got] == ["md1", "md1", "md0"]
    assert tap.subscriber.gaps == 0


async def test_a_relay_restarted_with_its_sequence_back_at_zero_is_a_gap() -> None:
    async with relay_and_tap(replay=False) as (publisher, tap):
        await _relayed(publisher)
        publisher._sequence = 0
        await _relayed(publisher)
        await tap.get()
        restarted = await tap.get()
    assert (restarted.gap, restarted.missed, restarted.sequence) == (True, 0, 0)


class Blackhole:
    """A TCP proxy whose connections can go dead without closing: bytes are dropped both
    ways, as when the line's firewall forgets a connection or the relay's host is gone.
    Connections made afterwards work."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.dead: list[list[bool]] = []
        self.handlers: list[asyncio.Task[None]] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.append(task)
        dead = [False]
        self.dead.append(dead)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                if not dead[0]:
                    dst.write(data)
                    await dst.drain()

        up_writer = None
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except (asyncio.CancelledError, OSError):
            pass  # closed by the test (a handler ending on cancel keeps asyncio quiet)
        finally:
            for w in (writer, up_writer):
                if w is not None:
                    w.close()

    def kill_connections(self) -> None:
        for dead in self.dead:
            dead[0] = True

    async def aclose(self) -> None:
        assert self.server is not None
        self.server.close()
        for task in self.handlers:
            task.cancel()
        await asyncio.gather(*self.handlers, return_exceptions=True)


async def test_a_connection_gone_dead_without_closing_is_dropped_and_made_again() -> None:
    """A SUB socket never sends: without heartbeats it waits on a dead connection for ever
    and the relayed instances are never updated again. With them, the connection is
    dropped, made again, and the next batch clears what the relay covers."""
    publisher = KVEventPublisher("tcp://127.0.0.1:*")
    proxy = Blackhole(int(publisher.endpoint.rsplit(":", 1)[1]))
    await proxy.start()
    source = KVRelaySource(endpoint=f"tcp://127.0.0.1:{proxy.port}", instances=SOURCE_INSTANCES)
    tap = Tap(RelaySubscriber(source, hashing=HASHING, heartbeat_s=0.1))
    try:
        await _until_heard(publisher, tap)
        proxy.kill_connections()
        async with asyncio.timeout(5):
            while True:
                await _relayed(publisher, (7,))
                with contextlib.suppress(TimeoutError):
                    after = await tap.get(0.1)
                    break
    finally:
        await tap.aclose()
        await publisher.aclose()
        await proxy.aclose()
    assert after.gap
    assert [e.kind for e in after.events[:2]] == [RelayKind.LOST, RelayKind.CLEARED]


# -- hostile input ---------------------------------------------------------------------


async def test_the_subscriber_skips_a_deeply_nested_message_and_resyncs() -> None:
    async with relay_and_tap(replay=False) as (publisher, tap):
        await _relayed(publisher)
        await publisher.publish_payload(b"\x91" * 5000 + b"\xc0")
        await _relayed(publisher, (3,))
        first, after = await tap.get(), await tap.get()
    assert not first.gap
    assert (after.gap, after.missed) == (True, 1)
    assert tap.subscriber.malformed == 1


async def test_the_subscriber_skips_a_garbled_message_and_resyncs() -> None:
    async with relay_and_tap(replay=False) as (publisher, tap):
        await _relayed(publisher)
        await publisher.publish_payload(b"\x94\x01\xcb\x00")  # garbled, with its sequence
        await _relayed(publisher, (3,))
        first, after = await tap.get(), await tap.get()
    assert not first.gap
    assert (after.gap, after.missed) == (True, 1)
    assert [e.kind for e in after.events[:2]] == [RelayKind.LOST, RelayKind.CLEARED]
    assert tap.subscriber.malformed == 1


async def test_events_of_instances_the_router_did_not_assign_to_the_relay_are_dropped() -> None:
    async with relay_and_tap(replay=False) as (publisher, tap):
        events = [RelayedEvent(RelayKind.STORED, "p0", (1,), BS),
                  RelayedEvent(RelayKind.CLEARED, "md1")]  # fmt: skip
        await publisher.publish_payload(encode_relayed(events, hashing=HASHING))
        batch = await tap.get()
    assert [e.instance_id for e in batch.events] == ["md1"]
    assert tap.subscriber.foreign == 1


# -- settings and the command --------------------------------------------------------


async def test_a_forwarding_relay_passes_an_upstream_gap_on_as_clears() -> None:
    """A relay forwarding another marks nothing itself downstream: what its subscription
    lost upstream reaches the routers as a loss and a clear of each instance covered."""
    captured = Captured()
    relay = KVRelay(captured, {}, block_size=BS)  # type: ignore[arg-type]
    stored = RelayedEvent(RelayKind.STORED, "md0", (1, 2), BS)
    relay.forward(RelayedBatch(1.0, [stored]).marked_gap(3, ["md0", "md1"]))
    await relay.flush()
    events = RelayDecoder().decode(captured.payloads[0]).events
    assert [(e.kind, e.instance_id) for e in events] == [
        (RelayKind.LOST, "md0"), (RelayKind.CLEARED, "md0"),
        (RelayKind.LOST, "md1"), (RelayKind.CLEARED, "md1"), (RelayKind.STORED, "md0"),
    ]  # fmt: skip
    assert relay.stats.gaps_in == 1


async def test_a_failed_engine_subscription_is_relayed_as_a_clear_and_made_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unexpected error in one engine's subscription neither stops the relay nor leaves
    that instance's blocks standing downstream: a loss and a clear go out, then the events
    of the new subscription."""
    import router.kv_relay.relay as relay_module

    prompt = [(3 * i + 1) % 50_000 for i in range(2 * BS)]
    attempts: list[str] = []

    class Flaky:
        name = "flaky"  # as a subscriber names its publisher in logs

        def __init__(self, instance_id: str, endpoint: str) -> None:
            self.instance_id = instance_id

        async def batches(self) -> AsyncIterator[KVEventBatch]:
            attempts.append(self.instance_id)
            if len(attempts) == 1:
                raise RuntimeError("subscription broke")
            yield KVEventBatch(instance_id=self.instance_id, timestamp=1.0,
                               events=[_stored(prompt, [1, 2], None)])  # fmt: skip
            await asyncio.sleep(3600)

        def close(self) -> None:
            pass

    monkeypatch.setattr(relay_module, "KVEventSubscriber", Flaky)
    monkeypatch.setattr(relay_module, "RETRY_S", 0.0)
    captured = Captured()
    relay = KVRelay(captured, {"md0": "tcp://engine:5557"}, block_size=BS, batch_window_s=0)  # type: ignore[arg-type]
    task = asyncio.create_task(relay.run())
    try:
        async with asyncio.timeout(5):
            while sum(len(RelayDecoder().decode(p).events) for p in captured.payloads) < 3:
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    events = [e for p in captured.payloads for e in RelayDecoder().decode(p).events]
    assert attempts == ["md0", "md0"]
    assert [(e.kind, e.instance_id) for e in events] == [
        (RelayKind.LOST, "md0"), (RelayKind.CLEARED, "md0"), (RelayKind.STORED, "md0"),
    ]  # fmt: skip
    assert events[2].blocks == chain_hashes(prompt, BS).hashes


async def test_the_router_clears_a_failed_relays_instances_and_subscribes_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Instances.consume_relay after an unexpected error: md0's blocks are cleared (not left as they
    were) and the relay's next subscription is applied."""
    from types import SimpleNamespace

    import router.service.lifecycle as lifecycle

    index = _index()
    ingestor = KVEventIngestor(index, block_size=BS)
    index.store("md0", [101, 102, 103])
    attempts: list[int] = []

    class Flaky:
        name = "flaky"  # as a subscriber names its publisher in logs

        def __init__(
            self, source: KVRelaySource, *, hashing: Hashing, max_batch_blocks: int,
            limit_name: str,
        ) -> None:  # fmt: skip
            assert hashing == HASHING
            assert (max_batch_blocks, limit_name) == (
                1000,
                "PDD_ROUTER_SERVICE__MAX_KV_RELAY_BATCH_BLOCKS",
            )  # the router's setting, named

        async def batches(self) -> AsyncIterator[RelayedBatch]:
            attempts.append(len(attempts))
            if len(attempts) == 1:
                raise RuntimeError("relay stream broke")
            yield RelayedBatch(2.0, [RelayedEvent(RelayKind.STORED, "md0", (7, 8), BS)])

        def close(self) -> None:
            pass

    class Lane:
        async def run(self, fn: Any, *args: Any) -> Any:
            return fn(*args)

    counter = SimpleNamespace(labels=lambda _iid: SimpleNamespace(inc=lambda: None))
    svc = SimpleNamespace(
        pool=SimpleNamespace(configs={"md0": object()}), peers=None, lane=Lane(),
        ingestor=ingestor, metrics=SimpleNamespace(kv_events=counter, kv_event_gaps=counter),
        settings=SimpleNamespace(service=SimpleNamespace(max_kv_relay_batch_blocks=1000)),
    )  # fmt: skip
    monkeypatch.setattr(lifecycle, "RelaySubscriber", Flaky)
    monkeypatch.setattr(lifecycle, "RELAY_RETRY_S", 0.0)
    source = KVRelaySource(endpoint="tcp://relay:5600", instances=["md0"])
    async with asyncio.timeout(5):
        await lifecycle.Instances.consume_relay(svc, source)  # type: ignore[arg-type]
    assert attempts == [0, 1]
    assert index.match([101, 102, 103]) == {"md0": 0, "md1": 0}  # cleared
    assert index.match([7, 8]) == {"md0": 2, "md1": 0}

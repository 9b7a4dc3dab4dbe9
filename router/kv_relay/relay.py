"""The KV relay: one datacenter's engines' KV events, re-hashed and batched into one
compact stream for the routers of the other datacenter.

Each engine is subscribed to as a router subscribes to it (``KVEventSubscriber``: its
sequence checked, a gap marked with a leading clear), and its batches go through the
router's own ``KVEventIngestor``, which re-hashes stored runs from their token IDs under
the router's chain hash and maps removals to the hashes they stored. What the ingestor
would write to an index is collected instead (``RelayedEvent``) and published every
``batch_window_s`` as one message of the compact stream (``router.kv_relay.wire``),
with the relay's own sequence numbers and a replay buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial

import structlog

from engines_adapter.contract import KVEventBatch
from engines_adapter.kv_publisher import KVEventPublisher
from engines_adapter.kv_subscriber import KVEventSubscriber, follow
from router.kv_ingest import KVEventIngestor
from router.kv_relay.receiver import RelaySubscriber
from router.kv_relay.settings import KVRelaySource
from router.kv_relay.wire import Hashing, RelayedBatch, RelayedEvent, RelayKind, encode_relayed

__all__ = ["KVRelay", "RelayStats", "split_batch"]

log = structlog.get_logger("pdd_router.kv_relay")

RETRY_S = 1.0
"""How long after an unexpected failure a source is subscribed to again."""


@dataclass(slots=True)
class RelayStats:
    """What the relay heard and published, cumulative."""

    batches_in: int = 0
    gaps_in: int = 0  # engine batches that followed lost ones
    batches_out: int = 0
    events_out: int = 0
    blocks_out: int = 0
    bytes_out: int = 0


class _Recorder:
    """Where the relay's ingestor writes: each update becomes a relayed event. Stored runs
    are taken from the observer's side, which hears each run once the index would have it,
    with the engine's block size."""

    def __init__(self, out: Callable[[RelayedEvent], None]) -> None:
        self.out = out

    def store_many(self, items: Sequence[tuple[str, Sequence[int]]]) -> None:
        pass  # ``stored`` below hears the same runs, in the same order

    def remove(self, instance_id: str, blocks: Sequence[int]) -> None:
        self.out(RelayedEvent(RelayKind.REMOVED, instance_id, tuple(blocks)))

    def clear(self, instance_id: str) -> None:
        self.out(RelayedEvent(RelayKind.CLEARED, instance_id))

    def stored(self, instance_id: str, blocks: Sequence[int], engine_block_size: int) -> None:
        self.out(RelayedEvent(RelayKind.STORED, instance_id, tuple(blocks), engine_block_size))

    def lost(self, instance_id: str) -> None:
        self.out(RelayedEvent(RelayKind.LOST, instance_id))


def split_batch(events: Sequence[RelayedEvent], limit: int) -> Iterator[list[RelayedEvent]]:
    """``events`` in order, in batches of at most ``limit`` blocks and ``limit`` events (what
    a receiver accepts); a run of more than ``limit`` blocks is cut into consecutive pieces."""
    batch: list[RelayedEvent] = []
    blocks = 0
    for event in events:
        size = len(event.blocks)
        pieces = [event] if size <= limit else [
            replace(event, blocks=event.blocks[i : i + limit]) for i in range(0, size, limit)
        ]  # fmt: skip
        for piece in pieces:
            if batch and (blocks + len(piece.blocks) > limit or len(batch) >= limit):
                yield batch
                batch, blocks = [], 0
            batch.append(piece)
            blocks += len(piece.blocks)
    if batch:
        yield batch


class KVRelay:
    """Relays the KV events of ``sources`` (instance id -> its KV-event endpoint) through
    ``publisher``; ``run`` until cancelled. ``accept`` and ``flush`` are the parts a test
    drives without sockets."""

    def __init__(
        self,
        publisher: KVEventPublisher,
        sources: dict[str, str],
        *,
        block_size: int,
        seed: int = 0,
        batch_window_s: float = 0.002,
        max_batch_blocks: int = 65_536,
        upstream: Sequence[KVRelaySource] = (),
    ) -> None:
        self.publisher = publisher
        self.sources = dict(sources)
        self.upstream = list(upstream)
        self.hashing = Hashing(block_size, seed)
        self.batch_window_s = batch_window_s
        self.max_batch_blocks = max_batch_blocks
        recorder = _Recorder(self._add)
        self.ingestor = KVEventIngestor(
            recorder, block_size=block_size, seed=seed, observer=recorder
        )
        self.stats = RelayStats()
        self._pending: list[RelayedEvent] = []
        self._pending_blocks = 0
        self._wake = asyncio.Event()
        self._full = asyncio.Event()

    def _add(self, event: RelayedEvent) -> None:
        self._pending.append(event)
        self._pending_blocks += len(event.blocks)

    def accept(self, batch: KVEventBatch) -> None:
        """One engine batch: its events, re-hashed, join the next relayed batch."""
        self.stats.batches_in += 1
        self.stats.gaps_in += int(batch.gap)
        try:
            self.ingestor.apply(batch)
        except Exception as exc:  # one bad batch must not stop the relay: its blocks are lost
            log.error("kv relay: batch not applied", instance=batch.instance_id, error=repr(exc))
            self._add(RelayedEvent(RelayKind.LOST, batch.instance_id))
        self._woken()

    def _woken(self) -> None:
        if self._pending:
            self._wake.set()
            if self._pending_blocks >= self.max_batch_blocks:
                self._full.set()

    async def flush(self) -> int | None:
        """Publish what is pending, as one batch or as several of at most
        ``max_batch_blocks`` blocks each; the last one's sequence number (None: nothing)."""
        pending, self._pending, self._pending_blocks = self._pending, [], 0
        seq = None
        for events in split_batch(pending, self.max_batch_blocks):
            payload = encode_relayed(events, hashing=self.hashing)
            seq = await self.publisher.publish_payload(payload)
            stats = self.stats
            stats.batches_out += 1
            stats.events_out += len(events)
            stats.blocks_out += sum(len(e.blocks) for e in events)
            stats.bytes_out += len(payload)
        return seq

    async def run(self) -> None:
        """Subscribe to every source and publish batches, until cancelled."""
        tasks = [asyncio.create_task(self._consume(iid, ep)) for iid, ep in self.sources.items()]
        tasks += [asyncio.create_task(self._forward(source)) for source in self.upstream]
        try:
            await self._flush_loop()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _consume(self, instance_id: str, endpoint: str) -> None:
        """An engine's events, until cancelled; after an unexpected failure the instance
        is relayed as lost and cleared, and subscribed to again after ``RETRY_S``."""

        async def apply(batch: KVEventBatch) -> None:
            self.accept(batch)

        async def lost() -> None:
            self._add(RelayedEvent(RelayKind.LOST, instance_id))
            self._add(RelayedEvent(RelayKind.CLEARED, instance_id))
            self._woken()

        await follow(lambda: KVEventSubscriber(instance_id, endpoint), apply, lost,
                     retry_s=RETRY_S)  # fmt: skip

    def forward(self, batch: RelayedBatch) -> None:
        """One batch of an upstream relay: its events join the next batch as they are (after
        a gap upstream, led by a loss and a clear of each instance that relay covers)."""
        self.stats.batches_in += 1
        self.stats.gaps_in += int(batch.gap)
        for event in batch.events:
            self._add(event)
        self._woken()

    async def _forward(self, source: KVRelaySource) -> None:
        """An upstream relay's batches, until cancelled; after an unexpected failure its
        instances are relayed as lost and cleared, and it is subscribed to again."""

        async def apply(batch: RelayedBatch) -> None:
            self.forward(batch)

        async def lost() -> None:
            self.forward(RelayedBatch(time.time(), []).marked_gap(0, tuple(source.instances)))

        subscribe = partial(RelaySubscriber, source, hashing=self.hashing,
                            max_batch_blocks=self.max_batch_blocks)  # fmt: skip
        await follow(subscribe, apply, lost, retry_s=RETRY_S)

    async def _flush_loop(self) -> None:
        while True:
            await self._wake.wait()
            if self.batch_window_s > 0 and not self._full.is_set():
                with contextlib.suppress(TimeoutError):  # a full batch cuts the wait short
                    await asyncio.wait_for(self._full.wait(), self.batch_window_s)
            self._wake.clear()
            self._full.clear()
            await self.flush()

"""A router's side of a KV relay: subscribing to its compact stream, and applying it.

The subscription is the one engines get (``SequencedSubscriber``): the relay's sequence
numbers are checked, a hole is filled from the relay's replay socket when it has one,
and otherwise (or after a dropped connection, or a relay restarted with its sequence
back at 0) the next batch is led by a loss and a clear of every instance the relay
covers, as an engine's gap leads with AllBlocksCleared: the index under-counts those
instances until their next stored events, rather than keeping blocks they may have
evicted meanwhile. A batch the relay hashed under other ``block_size``/``hash_seed`` than
the subscriber's is refused (logged, counted as malformed): its blocks would match none
of this side's prompts; so is a batch of more than ``max_batch_blocks`` blocks, unread (a
relay splits its batches to that size). Either refusal is a gap: the next batch is led
by a clear of every instance the relay covers.
"""

from __future__ import annotations

from collections.abc import Sequence

import zmq.asyncio

from engines_adapter.kv_subscriber import HEARTBEAT_S, SequencedSubscriber
from router.kv_ingest import KVEventIngestor
from router.kv_relay.settings import MAX_BATCH_BLOCKS, KVRelaySource
from router.kv_relay.wire import Hashing, RelayDecoder, RelayedBatch, RelayedEvent, RelayKind

__all__ = ["RelaySubscriber", "apply_relayed", "by_instance"]


class RelaySubscriber(SequencedSubscriber[RelayedBatch]):
    """Subscribes to one KV relay whose blocks are hashed under ``hashing`` (others are
    refused), at most ``max_batch_blocks`` a batch (``limit_name``: that setting, named
    when a batch is refused for it); iterate ``batches()``. Events of instances the
    source does not list are dropped (``foreign`` counts them)."""

    def __init__(
        self,
        source: KVRelaySource,
        *,
        hashing: Hashing,
        context: zmq.asyncio.Context | None = None,
        replay_timeout_s: float = 2.0,
        heartbeat_s: float | None = HEARTBEAT_S,
        max_batch_blocks: int = MAX_BATCH_BLOCKS,
        limit_name: str = "max_batch_blocks",
    ) -> None:
        super().__init__(
            f"relay {source.endpoint}", source.endpoint, replay_endpoint=source.replay_endpoint,
            context=context, replay_timeout_s=replay_timeout_s, heartbeat_s=heartbeat_s,
        )  # fmt: skip
        self.covered = tuple(source.instances)
        self._covered = frozenset(source.instances)
        self.decoder = RelayDecoder(
            expect=hashing, max_blocks=max_batch_blocks, limit_name=limit_name
        )
        self.foreign = 0

    def decode_frames(self, frames: Sequence[bytes]) -> RelayedBatch:
        batch = self.decoder.decode_frames(frames)
        kept = [e for e in batch.events if e.instance_id in self._covered]
        self.foreign += len(batch.events) - len(kept)
        batch.events = kept
        return batch

    def mark_gap(self, batch: RelayedBatch, missed: int) -> RelayedBatch:
        return batch.marked_gap(missed, self.covered)


def by_instance(batch: RelayedBatch) -> dict[str, list[RelayedEvent]]:
    """The batch's events per instance, each instance's in their order."""
    out: dict[str, list[RelayedEvent]] = {}
    for event in batch.events:
        out.setdefault(event.instance_id, []).append(event)
    return out


def apply_relayed(ingestor: KVEventIngestor, events: Sequence[RelayedEvent]) -> None:
    """Apply relayed events to the ingestor's index, as ``KVEventIngestor.apply`` applies an
    engine's: consecutive stored runs as one ``store_many``, the observer told of each
    stored run and each loss, the counts kept. The hashes are the router's already."""
    stats = ingestor.stats
    stats.batches += 1
    index, observer = ingestor.index, ingestor.observer
    runs: list[RelayedEvent] = []

    def flush() -> None:
        if not runs:
            return
        done = list(runs)
        runs.clear()
        index.store_many([(e.instance_id, e.blocks) for e in done])
        stats.stored_blocks += sum(len(e.blocks) for e in done)
        if observer is not None:
            for e in done:
                observer.stored(e.instance_id, e.blocks, e.engine_block_size or 0)

    for event in events:
        if event.kind == RelayKind.STORED:
            if event.blocks:
                runs.append(event)
            continue
        flush()
        if event.kind == RelayKind.REMOVED:
            if event.blocks:
                index.remove(event.instance_id, event.blocks)
                stats.removed_blocks += len(event.blocks)
        elif event.kind == RelayKind.CLEARED:
            index.clear(event.instance_id)
            ingestor.forget(event.instance_id)
            stats.clears += 1
        elif observer is not None:
            observer.lost(event.instance_id)
    flush()

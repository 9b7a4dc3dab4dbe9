"""Apply engines' KV events to the prefix index under the router's own chain hashes.

Engines' block hashes are not reproducible (vLLM seeds them randomly), so each
stored block is re-hashed from its token IDs with the router's chain hash, and a
"dual key" maps the engine's hash to the router's hashes so that later removals,
which name only the engine's hash, can be applied.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engines_adapter.contract import KVEvent, KVEventBatch
from router.hashing import HashExtras, chain_hashes

__all__ = [
    "CHUNK_COST",
    "IndexWriter",
    "IngestStats",
    "KVEventIngestor",
    "KVObserver",
    "event_extras",
]

EngineHash = int | str
_Run = tuple[list[int], int]  # a stored run not yet in the index: router hashes, engine block size
CHUNK_COST = 8192
"""``apply_in_chunks`` yields to the event loop after events of about this many token IDs
and block hashes (a few milliseconds of work)."""


def event_extras(event: KVEvent) -> HashExtras | None:
    """The isolation a stored run was hashed with, as the router hashes it: the LoRA
    name (every block) and the cache salt (a bare string among the first block's extra
    keys, when the run starts a prompt). Raises ValueError for keys the router cannot
    re-hash at its own block size (multimodal items, prompt embeddings)."""
    lora = event.lora_name
    salt: str | None = None
    for j, keys in enumerate(event.extra_keys or ()):
        rest = list(keys or ())
        if lora is not None and rest[:1] == [lora]:
            rest = rest[1:]
        first = j == 0 and event.parent_block_hash is None
        if first and len(rest) == 1 and isinstance(rest[0], str):
            salt, rest = rest[0], []
        if rest:
            raise ValueError(f"extra keys the router does not re-hash: {rest!r:.80}")
    if lora is None and salt is None:
        return None
    return HashExtras(cache_salt=salt, lora_name=lora)


class IndexWriter(Protocol):
    """What the ingestor writes to: a prefix index's updates (or the KV relay, which
    publishes them instead)."""

    def store_many(self, items: Sequence[tuple[str, Sequence[int]]]) -> None: ...

    def remove(self, instance_id: str, blocks: Sequence[int]) -> None: ...

    def clear(self, instance_id: str) -> None: ...


class KVObserver(Protocol):
    """Hears what the ingestor applied (the live service reads realized hits from it)."""

    def stored(self, instance_id: str, blocks: Sequence[int], engine_block_size: int) -> None:
        """One stored event's run, under the router's hashes (parent first)."""
        ...

    def lost(self, instance_id: str) -> None:
        """Stored events of the instance were lost or could not be applied (a gap, an
        unknown parent, blocks not a whole number of router blocks)."""
        ...


@dataclass(slots=True)
class IngestStats:
    """Counts of what the ingestor did, cumulative."""

    batches: int = 0
    stored_blocks: int = 0
    removed_blocks: int = 0
    clears: int = 0
    orphans: int = 0  # stored blocks whose parent the router never saw
    unaligned: int = 0  # engine blocks that are not a whole number of router blocks
    invalid: int = 0  # stored blocks with token IDs outside [0, 2**63)
    unhashable: int = 0  # stored blocks with extra keys beyond a LoRA name and a salt


class KVEventIngestor:
    """Turns KVEventBatches into index updates; keeps the engine-hash -> router-hash map."""

    def __init__(
        self,
        index: IndexWriter,
        *,
        block_size: int,
        seed: int = 0,
        max_mapped_per_instance: int = 2_000_000,
        observer: KVObserver | None = None,
    ) -> None:
        """``observer`` hears every stored event once the index has it, under the router's
        hashes, and every loss (the live service reads realized hits from it)."""
        self.index = index
        self.block_size = block_size
        self.seed = seed
        self.max_mapped = max_mapped_per_instance
        self.observer = observer
        self.stats = IngestStats()
        # per instance: engine hash -> (router hashes, how many times it is stored);
        # vLLM may store one hash twice (two requests computing the same block at once)
        # and then removes it twice, so a block is gone only when its count reaches 0
        self._dual: dict[str, OrderedDict[EngineHash, tuple[tuple[int, ...], int]]] = {}

    def forget(self, instance_id: str) -> None:
        """Drop the dual-key map of an instance (it was removed or restarted)."""
        self._dual.pop(instance_id, None)

    def apply(self, batch: KVEventBatch) -> None:
        """Apply a batch's events in order; consecutive stored runs reach the index as one
        ``store_many`` (one round trip to a shared index), flushed before a removal or a
        clear reaches it, so the index sees the updates in the batch's order."""
        self._begin(batch)
        pending: list[_Run] = []
        for event in batch.events:
            self._apply(batch.instance_id, event, pending)
        self._flush(batch.instance_id, pending)

    async def apply_in_chunks(self, batch: KVEventBatch, *, chunk_cost: int = CHUNK_COST) -> None:
        """``apply``, yielding to the event loop between chunks of events of about
        ``chunk_cost`` token IDs and block hashes, so a large batch does not hold the loop
        (the index has every event of a chunk before the loop runs again)."""
        self._begin(batch)
        pending: list[_Run] = []
        cost = 0
        for event in batch.events:
            self._apply(batch.instance_id, event, pending)
            cost += 1 + len(event.block_hashes) + len(event.token_ids)
            if cost >= chunk_cost:
                cost = 0
                self._flush(batch.instance_id, pending)
                await asyncio.sleep(0)
        self._flush(batch.instance_id, pending)

    def _begin(self, batch: KVEventBatch) -> None:
        self.stats.batches += 1
        if batch.gap and self.observer is not None:
            self.observer.lost(batch.instance_id)

    def _flush(self, instance_id: str, pending: list[_Run]) -> None:
        """Send the pending stored runs to the index as one update, then tell the observer
        (``pending`` is emptied, also when the index raises)."""
        if not pending:
            return
        runs = list(pending)
        pending.clear()
        self.index.store_many([(instance_id, run) for run, _ in runs])
        self.stats.stored_blocks += sum(len(run) for run, _ in runs)
        if self.observer is not None:
            for run, engine_bs in runs:
                self.observer.stored(instance_id, run, engine_bs)

    def _apply(self, instance_id: str, event: KVEvent, pending: list[_Run]) -> None:
        if event.type == "BlockStored":
            self._stored(instance_id, event, pending)
        elif event.type == "BlockRemoved":
            self._removed(instance_id, event, pending)
        elif event.type == "AllBlocksCleared":
            self._flush(instance_id, pending)
            self.index.clear(instance_id)
            self._dual.pop(instance_id, None)
            self.stats.clears += 1

    def _stored(self, instance_id: str, event: KVEvent, pending: list[_Run]) -> None:
        dual = self._dual.setdefault(instance_id, OrderedDict())
        n = len(event.block_hashes)
        if n == 0:
            return
        engine_bs = event.block_size or len(event.token_ids) // n
        if engine_bs <= 0 or engine_bs % self.block_size or len(event.token_ids) < n * engine_bs:
            self.stats.unaligned += n
            self._lost(instance_id, pending)
            return
        try:  # out of int64: OverflowError; the checks below run in C
            tokens = np.array(event.token_ids[: n * engine_bs], dtype=np.int64)
        except (OverflowError, TypeError, ValueError):
            tokens = None
        if tokens is None or int(tokens.min()) < 0:
            self.stats.invalid += n
            self._lost(instance_id, pending)
            return
        try:
            extras = event_extras(event)
        except ValueError:
            self.stats.unhashable += n
            self._lost(instance_id, pending)
            return
        parent: int | None = None
        if event.parent_block_hash is not None:
            known = dual.get(event.parent_block_hash)
            if known is None:
                self.stats.orphans += n
                self._lost(instance_id, pending)
                return
            parent = known[0][-1]
        # the run hashed at once: chaining from the parent, hashing the event's blocks
        # together gives each engine block the hashes it would get alone
        chain = chain_hashes(tokens, self.block_size, self.seed, parent=parent, extras=extras)
        new = list(chain.hashes)
        per = engine_bs // self.block_size
        for j, engine_hash in enumerate(event.block_hashes):
            ours = tuple(new[j * per : (j + 1) * per])
            count = dual[engine_hash][1] if engine_hash in dual else 0
            dual[engine_hash] = (ours, count + 1)
            dual.move_to_end(engine_hash)
        while len(dual) > self.max_mapped:
            dual.popitem(last=False)
        pending.append((new, engine_bs))

    def _lost(self, instance_id: str, pending: list[_Run]) -> None:
        if self.observer is not None:
            self._flush(instance_id, pending)  # the observer hears the events in order
            self.observer.lost(instance_id)

    def _removed(self, instance_id: str, event: KVEvent, pending: list[_Run]) -> None:
        dual = self._dual.get(instance_id)
        if not dual:
            return
        gone: list[int] = []
        for engine_hash in event.block_hashes:
            entry = dual.get(engine_hash)
            if entry is None:
                continue
            ours, count = entry
            if count > 1:
                dual[engine_hash] = (ours, count - 1)
                continue
            del dual[engine_hash]
            gone.extend(ours)
        if gone:
            self._flush(instance_id, pending)
            self.index.remove(instance_id, gone)
            self.stats.removed_blocks += len(gone)

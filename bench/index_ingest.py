"""The ingest half of `pdd-router bench index`: KV-event batches as engines publish them,
stored one event per call (``store``) and one batch per call (``store_many``).

Each batch is one instance's (of ``INGEST_INSTANCES``), 16 to 64 stored events of 1 to 32
blocks each: new blocks, or (at first, until each instance has them all) one of a few
32-block prompt prefixes the instances share, whose blocks other instances may hold
already.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from policies.tiers import Tier
from router.index.base import IndexedInstance, PrefixIndex
from router.index.memory_index import MemoryPrefixIndex
from router.index.redis_index import RedisPrefixIndex

__all__ = [
    "BLOCKS_PER_EVENT",
    "EVENTS_PER_BATCH",
    "INGEST_INSTANCES",
    "IngestRow",
    "ingest_batches",
    "ingest_rows",
    "percentile",
]

INGEST_INSTANCES = 8
EVENTS_PER_BATCH = (16, 64)
BLOCKS_PER_EVENT = (1, 32)
SHARED_PREFIXES = 16  # prompt prefixes of 32 blocks the instances share
SHARED_EVENTS = 0.2  # chance that a stored event is a shared prefix the instance lacks


@dataclass(frozen=True)
class IngestRow:
    """KV-event batches stored one way: ``store`` per event or ``store_many`` per batch."""

    path: str
    batches: int
    events: int
    blocks: int
    memory_blocks_per_s: float
    redis_blocks_per_s: float | None = None
    ping_p50_us: float | None = None
    redis_blocks_per_ping: float | None = None  # in the time of one PING: load-normalised


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


Batch = list[tuple[str, list[int]]]


def ingest_batches(rng: random.Random, count: int) -> list[Batch]:
    """``count`` KV-event batches: each one instance's stored runs, in order. A run of a
    shared prefix is one the instance does not hold yet (engines only report blocks they
    newly cached), so other instances may hold its blocks already."""
    shared = [[rng.getrandbits(64) for _ in range(32)] for _ in range(SHARED_PREFIXES)]
    unstored = {i: list(range(SHARED_PREFIXES)) for i in range(INGEST_INSTANCES)}
    out = []
    for _ in range(count):
        i = rng.randrange(INGEST_INSTANCES)
        instance_id = _ingest_instance(i).instance_id
        batch = []
        for _ in range(rng.randint(*EVENTS_PER_BATCH)):
            size = rng.randint(*BLOCKS_PER_EVENT)
            if unstored[i] and rng.random() < SHARED_EVENTS:
                run = shared[unstored[i].pop(rng.randrange(len(unstored[i])))]
            else:
                run = [rng.getrandbits(64) for _ in range(size)]
            batch.append((instance_id, run))
        out.append(batch)
    return out


def _ingest_instance(i: int) -> IndexedInstance:
    return IndexedInstance(f"ingest-{i:02d}", Tier.MD, "dc-a")


def _ingest(
    index: PrefixIndex,
    batches: Sequence[Batch],
    batched: bool,
    ping: Callable[[], float] | None = None,
) -> tuple[float, list[float]]:
    """Store the batches (``store_many`` per batch, or ``store`` per event) on a fresh set
    of instances; blocks per second of store time, and a PING before each batch."""
    for i in range(INGEST_INSTANCES):
        index.register(_ingest_instance(i))
    blocks = sum(len(run) for batch in batches for _, run in batch)
    pings: list[float] = []
    elapsed = 0.0
    for batch in batches:
        if ping is not None:
            pings.append(ping())
        start = time.perf_counter()
        if batched:
            index.store_many(batch)
        else:
            for instance_id, run in batch:
                index.store(instance_id, run)
        elapsed += time.perf_counter() - start
    return (blocks / elapsed if elapsed > 0 else float("inf")), pings


def ingest_rows(
    redis_index: RedisPrefixIndex | None, batches: list[Batch], all_pings: list[float]
) -> list[IngestRow]:
    rows = []
    for path, batched in (("store", False), ("store_many", True)):
        memory, _ = _ingest(MemoryPrefixIndex(), batches, batched)
        row = IngestRow(
            path=path,
            batches=len(batches),
            events=sum(len(batch) for batch in batches),
            blocks=sum(len(run) for batch in batches for _, run in batch),
            memory_blocks_per_s=memory,
        )
        if redis_index is not None:
            try:
                rate, pings = _ingest(redis_index, batches, batched, redis_index.ping)
            finally:
                redis_index.delete_all_keys()
            all_pings.extend(pings)
            ping50 = percentile(pings, 0.5)
            row = replace(
                row,
                redis_blocks_per_s=rate,
                ping_p50_us=ping50 * 1e6,
                redis_blocks_per_ping=rate * ping50,
            )
        rows.append(row)
    return rows

"""`pdd-router bench index`: match latency and update throughput of the prefix indexes.

For each chain length (8, 256 and 8,192 blocks) one probed chain is drawn, and
instances are added in stages (16, then 64, then 256): each instance holds a prefix
of the probed chain at one of a few distinct depths (0, 1, about a tenth, a third,
half, three quarters, all but one, all) plus prefixes of two other chains drawn from
a shared pool, the way a cluster's caches overlap. After each stage the same match
is timed ``repeats`` times on the in-memory index and on the Redis index; every
Redis match is paired with a PING so that its latency can be read in round trips
measured under the same conditions. Store throughput is the blocks written by the
stores of the stage per second.

Ingest replays KV-event batches as engines publish them (``bench.index_ingest``). The
same batches are stored one event per call (``store``, one round trip each) and one batch
per call (``store_many``, as the KV-event ingestor sends them), on an empty index each
time; a PING before every batch gives the round trip of the same run. The Redis keys live
under a unique prefix and are deleted at the end.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import numpy as np

from bench import index_ingest
from bench.index_ingest import (
    BLOCKS_PER_EVENT,
    EVENTS_PER_BATCH,
    INGEST_INSTANCES,
    IngestRow,
    ingest_rows,
    percentile,
)
from policies.tiers import Tier
from router.hashing import PackedHashes, chain_hashes
from router.index.base import IndexedInstance, PrefixIndex
from router.index.memory_index import MemoryPrefixIndex
from router.index.redis_index import RedisPrefixIndex, redact_url

__all__ = ["IndexBenchResult", "IngestRow", "MatchRow", "render_index_bench", "run_index_bench"]

CHAIN_LENGTHS = (8, 256, 8192)
INSTANCE_COUNTS = (16, 64, 256)
HASH_TOKENS = 131_072
HASH_BLOCK_SIZE = 16
OTHER_CHAINS = 16  # pool of unrelated chains the instances also hold prefixes of
OTHERS_PER_INSTANCE = 2
INGEST_BATCHES = 300


@dataclass(frozen=True)
class MatchRow:
    """Figures of one (chain length, instance count) configuration."""

    chain_blocks: int
    instances: int
    distinct_depths: int
    memory_p50_us: float
    memory_p99_us: float
    memory_store_blocks_per_s: float
    redis_p50_us: float | None = None
    redis_p99_us: float | None = None
    ping_p50_us: float | None = None
    redis_p50_pings: float | None = None
    redis_p99_pings: float | None = None
    floor_p50_pings: float | None = None  # a script that returns at once, same arguments
    redis_store_blocks_per_s: float | None = None


@dataclass
class IndexBenchResult:
    repeats: int
    redis_url: str | None
    hash_tokens: int
    hash_block_size: int
    hash_ms: float
    ping_p50_us: float | None = None
    ping_p99_us: float | None = None
    rows: list[MatchRow] = field(default_factory=list)
    ingest: list[IngestRow] = field(default_factory=list)
    elapsed_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _depth_choices(length: int) -> list[int]:
    return sorted(
        {
            0,
            1,
            max(1, length // 10),
            length // 3,
            length // 2,
            (3 * length) // 4,
            length - 1,
            length,
        }
    )


def _instance(i: int) -> IndexedInstance:
    tier = (Tier.P, Tier.RLD, Tier.MD)[i % 3]
    return IndexedInstance(f"inst-{i:03d}", tier, "dc-a" if tier is not Tier.MD else "dc-b")


def _plan(
    rng: random.Random, chain: Sequence[int], others: list[list[int]], first: int, last: int
) -> list[tuple[IndexedInstance, list[list[int]]]]:
    """Instances first..last-1 and the chains each stores (the probed prefix last)."""
    depths = _depth_choices(len(chain))
    plan = []
    for i in range(first, last):
        depth = depths[i % len(depths)] if i < len(depths) else rng.choice(depths)
        chains = []
        for other in rng.sample(others, OTHERS_PER_INSTANCE):
            chains.append(other[: rng.randint(1, len(other))])
        if depth:
            chains.append(list(chain[:depth]))
        plan.append((_instance(i), chains))
    return plan


def _populate(index: PrefixIndex, plan: list[tuple[IndexedInstance, list[list[int]]]]) -> float:
    """Register and store the plan; returns blocks stored per second."""
    for spec, _ in plan:
        index.register(spec)
    blocks = sum(len(c) for _, chains in plan for c in chains)
    start = time.perf_counter()
    for spec, chains in plan:
        for c in chains:
            index.store(spec.instance_id, c)
    elapsed = time.perf_counter() - start
    return blocks / elapsed if elapsed > 0 else float("inf")


def _time_calls(call: Callable[[], object], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        out.append(time.perf_counter() - start)
    return out


def _hash_ms(rng: random.Random) -> float:
    tokens = np.array([rng.randrange(150_000) for _ in range(HASH_TOKENS)], dtype=np.int64)
    chain_hashes(tokens, HASH_BLOCK_SIZE)  # warm the power tables
    runs = []
    for _ in range(7):
        start = time.perf_counter()
        chain_hashes(tokens, HASH_BLOCK_SIZE)
        runs.append(time.perf_counter() - start)
    return percentile(runs, 0.5) * 1e3


def run_index_bench(
    redis_url: str | None,
    *,
    repeats: int = 200,
    chain_lengths: Sequence[int] | None = None,
    instance_counts: Sequence[int] | None = None,
    seed: int = 0,
    key_prefix: str | None = None,
    ingest_batches: int | None = None,
) -> IndexBenchResult:
    """Run the benchmark; ``redis_url=None`` measures the in-memory index only;
    ``ingest_batches`` KV-event batches (default ``INGEST_BATCHES``) are ingested each
    way (0: no ingest figures).

    An unreachable Redis raises :class:`router.errors.UserError` before any work. The
    Redis keys live under ``key_prefix`` (default: a fresh ``pdd-bench:...``) and are
    deleted at the end.
    """
    chain_lengths = CHAIN_LENGTHS if chain_lengths is None else chain_lengths
    instance_counts = INSTANCE_COUNTS if instance_counts is None else instance_counts
    ingest_batches = INGEST_BATCHES if ingest_batches is None else ingest_batches
    began = time.perf_counter()
    rng = random.Random(seed)
    prefix = key_prefix or f"pdd-bench:{uuid.uuid4().hex[:12]}"
    redis_index = None if redis_url is None else RedisPrefixIndex(redis_url, key_prefix=prefix)
    result = IndexBenchResult(
        repeats=repeats,
        redis_url=redis_url,
        hash_tokens=HASH_TOKENS,
        hash_block_size=HASH_BLOCK_SIZE,
        hash_ms=_hash_ms(rng),
    )
    all_pings: list[float] = []
    try:
        for length in chain_lengths:
            # as the router hands a chain to the index: hashes packed alongside (chain_hashes)
            chain = PackedHashes.of(
                np.array([rng.getrandbits(64) for _ in range(length)], dtype=np.uint64)
            )
            others = [
                [rng.getrandbits(64) for _ in range(min(length, 256))] for _ in range(OTHER_CHAINS)
            ]
            memory = MemoryPrefixIndex()
            added = 0
            for count in instance_counts:
                plan = _plan(rng, chain, others, added, count)
                added = count
                mem_store = _populate(memory, plan)
                expected = memory.match(chain)
                probe = partial(memory.match, chain)
                _time_calls(probe, 20)  # warm up
                mem = _time_calls(probe, repeats)
                row: dict[str, Any] = {
                    "chain_blocks": length,
                    "instances": count,
                    "distinct_depths": len(set(expected.values())),
                    "memory_p50_us": percentile(mem, 0.5) * 1e6,
                    "memory_p99_us": percentile(mem, 0.99) * 1e6,
                    "memory_store_blocks_per_s": mem_store,
                }
                if redis_index is not None:
                    row |= _redis_figures(redis_index, plan, chain, expected, repeats, all_pings)
                result.rows.append(MatchRow(**row))
            if redis_index is not None:
                redis_index.delete_all_keys()
        if ingest_batches > 0:
            batches = index_ingest.ingest_batches(rng, ingest_batches)
            result.ingest = ingest_rows(redis_index, batches, all_pings)
    finally:
        if redis_index is not None:
            redis_index.delete_all_keys()
            redis_index.close()
    if all_pings:
        result.ping_p50_us = percentile(all_pings, 0.5) * 1e6
        result.ping_p99_us = percentile(all_pings, 0.99) * 1e6
    result.elapsed_s = time.perf_counter() - began
    return result


def _redis_figures(
    index: Any,
    plan: list[tuple[IndexedInstance, list[list[int]]]],
    chain: Sequence[int],
    expected: dict[str, int],
    repeats: int,
    all_pings: list[float],
) -> dict[str, float]:
    store = _populate(index, plan)
    got = index.match(chain)
    if got != expected:  # a benchmark of wrong answers is worthless
        raise RuntimeError(f"Redis and memory indexes disagree on {len(chain)}-block chain")
    for _ in range(20):  # warm up: script cache, connection, names cache
        index.ping()
        index.match(chain)
    pings, matches, floors = [], [], []
    for _ in range(repeats):
        pings.append(index.ping())
        start = time.perf_counter()
        index.match(chain)
        matches.append(time.perf_counter() - start)
        floors.append(index.match_floor(chain))
    all_pings.extend(pings)
    ping50 = percentile(pings, 0.5)
    return {
        "redis_p50_us": percentile(matches, 0.5) * 1e6,
        "redis_p99_us": percentile(matches, 0.99) * 1e6,
        "ping_p50_us": ping50 * 1e6,
        "redis_p50_pings": percentile(matches, 0.5) / ping50,
        "redis_p99_pings": percentile(matches, 0.99) / ping50,
        "floor_p50_pings": percentile(floors, 0.5) / ping50,
        "redis_store_blocks_per_s": store,
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_index_bench(result: IndexBenchResult) -> Any:
    """The result as a rich renderable: a latency table, a throughput table, notes."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    def table(title: str, headers: Sequence[str]) -> Table:
        out = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")
        for header in headers:
            out.add_column(header, justify="right")
        return out

    latency = table(
        "Match latency, us (Redis also in PING round trips)",
        ["blocks", "inst", "depths", "mem\np50", "mem\np99", "redis\np50", "redis\np99",
         "p50\n/PING", "p99\n/PING", "floor\n/PING"],
    )  # fmt: skip
    updates = table(
        "Store throughput, blocks/s", ["blocks", "inst", "memory", "redis", "PING\np50 us"]
    )
    for row in result.rows:
        latency.add_row(
            f"{row.chain_blocks:,}",
            str(row.instances),
            str(row.distinct_depths),
            _fmt(row.memory_p50_us, ".1f"),
            _fmt(row.memory_p99_us, ".1f"),
            _fmt(row.redis_p50_us, ".1f"),
            _fmt(row.redis_p99_us, ".1f"),
            _fmt(row.redis_p50_pings, ".2f"),
            _fmt(row.redis_p99_pings, ".2f"),
            _fmt(row.floor_p50_pings, ".2f"),
        )
        updates.add_row(
            f"{row.chain_blocks:,}",
            str(row.instances),
            _fmt(row.memory_store_blocks_per_s, ",.0f"),
            _fmt(row.redis_store_blocks_per_s, ",.0f"),
            _fmt(row.ping_p50_us, ".1f"),
        )
    ingest = table(
        "KV-event ingest, blocks/s",
        ["path", "memory", "redis", "PING\np50 us", "redis blocks\nper PING"],
    )
    for item in result.ingest:
        ingest.add_row(
            item.path,
            _fmt(item.memory_blocks_per_s, ",.0f"),
            _fmt(item.redis_blocks_per_s, ",.0f"),
            _fmt(item.ping_p50_us, ".1f"),
            _fmt(item.redis_blocks_per_ping, ".1f"),
        )
    notes = [
        f"Hashing {result.hash_tokens:,} tokens at block size {result.hash_block_size} "
        f"({result.hash_tokens // result.hash_block_size:,} blocks): {result.hash_ms:.2f} ms",
    ]
    if result.redis_url is None:
        notes.append("Redis: skipped (--no-redis)")
    else:
        notes.append(
            f"Redis {redact_url(result.redis_url)}: PING p50 {_fmt(result.ping_p50_us, '.1f')} us, "
            f"p99 {_fmt(result.ping_p99_us, '.1f')} us over the run; p50/PING and p99/PING "
            "divide by the PING p50 measured alongside each configuration; floor/PING is a "
            "script that returns at once, called with the match's arguments (the chain, "
            "8 bytes a block): what a match costs before its first lookup."
        )
    if result.ingest:
        first = result.ingest[0]
        notes.append(
            f"Ingest: {first.batches:,} batches ({first.events:,} stored events, "
            f"{first.blocks:,} blocks), each one of {INGEST_INSTANCES} instances' "
            f"{EVENTS_PER_BATCH[0]}-{EVENTS_PER_BATCH[1]} events of "
            f"{BLOCKS_PER_EVENT[0]}-{BLOCKS_PER_EVENT[1]} blocks; store: one call per "
            "event, store_many: one per batch; a PING before every batch."
        )
    notes.append(f"{result.repeats} matches per configuration; {result.elapsed_s:.1f} s in all.")
    tables = [latency, updates, *([ingest] if result.ingest else [])]
    return Group(*tables, *(Text(note) for note in notes))

"""`pdd-router bench index` at toy sizes: it runs, checks itself, renders, cleans up."""

from __future__ import annotations

import json
import os
import uuid

import pytest
import redis
from rich.console import Console

from bench.index_bench import render_index_bench, run_index_bench
from cli.app import main

REDIS_URL = os.environ.get("PDD_ROUTER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def test_memory_only_bench_renders() -> None:
    result = run_index_bench(
        None, repeats=10, chain_lengths=(8, 64), instance_counts=(3, 10), ingest_batches=5
    )
    assert [(r.chain_blocks, r.instances) for r in result.rows] == [
        (8, 3),
        (8, 10),
        (64, 3),
        (64, 10),
    ]
    assert all(r.redis_p50_us is None for r in result.rows)
    assert result.rows[-1].distinct_depths == 8  # 0, 1, 6, 21, 32, 48, 63, 64
    assert result.hash_ms > 0
    assert [row.path for row in result.ingest] == ["store", "store_many"]
    assert all(row.memory_blocks_per_s > 0 and row.redis_blocks_per_s is None
               for row in result.ingest)  # fmt: skip
    assert result.ingest[0].blocks == result.ingest[1].blocks > 0
    console = Console(record=True, width=100)
    console.print(render_index_bench(result))
    text = console.export_text()
    assert "Redis: skipped (--no-redis)" in text
    assert "Hashing 131,072 tokens at block size 16" in text
    assert "KV-event ingest, blocks/s" in text
    assert "store_many" in text
    assert json.loads(json.dumps(result.to_json()))["rows"][0]["chain_blocks"] == 8


@pytest.mark.redis
def test_redis_bench_measures_and_deletes_its_keys() -> None:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1.0)
    try:
        client.ping()
    except redis.RedisError:
        pytest.skip(f"no redis-server at {REDIS_URL}")
    prefix = f"pdd-test:bench:{uuid.uuid4().hex}"
    try:
        result = run_index_bench(
            REDIS_URL,
            repeats=10,
            chain_lengths=(16,),
            instance_counts=(5, 12),
            key_prefix=prefix,
            ingest_batches=4,
        )
        assert list(client.scan_iter(match=f"{prefix}:*")) == []
    finally:
        leftover = list(client.scan_iter(match=f"{prefix}:*"))
        if leftover:
            client.delete(*leftover)
        client.close()
    for row in result.rows:
        assert row.redis_p50_us is not None
        assert row.redis_p50_pings is not None
        assert row.redis_p50_pings > 0
        assert row.floor_p50_pings is not None
        assert 0 < row.floor_p50_pings < 50
        assert row.redis_store_blocks_per_s is not None
    assert result.ping_p50_us is not None
    for item in result.ingest:
        assert item.redis_blocks_per_s is not None
        assert item.redis_blocks_per_s > 0
        assert item.ping_p50_us is not None
        assert item.redis_blocks_per_ping is not None


def test_cli_bench_index_no_redis_json(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import bench.index_bench as index_bench

    monkeypatch.setattr(index_bench, "CHAIN_LENGTHS", (8,))
    monkeypatch.setattr(index_bench, "INSTANCE_COUNTS", (4,))
    monkeypatch.setattr(index_bench, "INGEST_BATCHES", 3)
    assert main(["bench", "index", "--no-redis", "--json", "--repeats", "10"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["redis_url"] is None
    assert [(r["chain_blocks"], r["instances"]) for r in out["rows"]] == [(8, 4)]
    assert [r["path"] for r in out["ingest"]] == ["store", "store_many"]
    assert out["ingest"][0]["batches"] == 3

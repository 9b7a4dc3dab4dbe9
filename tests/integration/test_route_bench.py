"""`pdd-router bench route` prints a row per prompt size, index and path, and chat rows."""

from __future__ import annotations

import json
import os

import pytest

from cli.app import main

REDIS_URL = os.environ.get("PDD_ROUTER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.mark.redis
def test_route_bench_measures_every_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "route", "--redis-url", REDIS_URL, "--repeats", "10", "--json"]
    assert main([*argv, "--throughput-seconds", "1", "--chat-repeats", "5"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["latency"]
    keys = {(r["prompt_tokens"], r["index"], r["path"]) for r in rows}
    assert keys == {
        (n, index, path)
        for n in (8192, 131072)
        for index in ("memory", "redis")
        for path in ("in-process", "http")
    }
    for row in rows:
        assert 0 < row["p50_us"] <= row["p99_us"]
        assert (row["p50_pings"] is None) == (row["index"] == "memory")
        assert (row["vs_in_process"] is None) == (row["path"] == "in-process")
    load = out["throughput"]
    assert load["prompt_tokens"] == 8192
    assert load["failed"] == 0  # every route of the sustained load was answered 200
    assert load["routes_per_s"] > 0
    chat = {(r["target_tokens"], r["case"]): r for r in out["chat"]}
    assert set(chat) == {(n, case) for n in (8192, 32768) for case in ("fresh", "cached-prefix")}
    for row in chat.values():
        assert 0 < row["p50_us"] <= row["p99_us"]
        assert row["tokenize_p50_us"] > 0
        assert row["hash_p50_us"] > 0
        assert row["decide_p50_us"] > 0
        assert 0.9 * row["target_tokens"] <= row["prompt_tokens"] <= 1.1 * row["target_tokens"]
    for n in (8192, 32768):
        fresh, cached = chat[n, "fresh"], chat[n, "cached-prefix"]
        assert fresh["prompt_tokens"] == cached["prompt_tokens"]  # the same conversation
        assert fresh["reused_tokens"] == 0
        # the earlier turns come from the cache: most of the prompt is not tokenized again
        assert 0.5 * cached["prompt_tokens"] < cached["reused_tokens"] < cached["prompt_tokens"]

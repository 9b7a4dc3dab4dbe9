"""`pdd-router bench route` prints a row per prompt size, index and path."""

from __future__ import annotations

import json
import os

import pytest

from cli.app import main

REDIS_URL = os.environ.get("PDD_ROUTER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.mark.redis
def test_route_bench_measures_every_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "route", "--redis-url", REDIS_URL, "--repeats", "10", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
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

"""Two `pdd-router serve` processes on one redis-server share what they learn."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

REDIS_URL = os.environ.get("PDD_ROUTER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
PROMPT = [(5 * i + 1) % 512 for i in range(256)]  # 16 blocks of 16

pytestmark = pytest.mark.redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_replica(port: int, prefix: str, instances: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PDD_ROUTER_INDEX__BACKEND": "redis",
        "PDD_ROUTER_REDIS__URL": REDIS_URL,
        "PDD_ROUTER_REDIS__KEY_PREFIX": prefix,
        "PDD_ROUTER_SERVICE__ALLOW_UNAUTHENTICATED_ADMIN": "true",  # the test posts KV events
        "PDD_ROUTER_SERVICE__SHOW_SHARED_PREDICTIONS": "true",
    }
    cmd = [sys.executable, "-m", "cli.app", "serve", "--port", str(port),
           "--instances", str(instances), "--log-level", "warning"]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(log.read_text())
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} never became ready")


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[str, str]]:
    try:
        redis.Redis.from_url(REDIS_URL).ping()
    except redis.RedisError:
        pytest.skip(f"no redis-server at {REDIS_URL}")
    instances = tmp_path / "instances.yaml"
    instances.write_text(
        "- {instance_id: p0, tier: p, datacenter: A, adapter: sim}\n"
        "- {instance_id: md0, tier: md, datacenter: B, adapter: sim}\n"
        "- {instance_id: md1, tier: md, datacenter: B, adapter: sim}\n"
    )
    prefix = f"pdd-test:{uuid.uuid4().hex}"
    ports = free_port(), free_port()
    logs = [tmp_path / f"replica-{port}.log" for port in ports]
    procs = [start_replica(p, prefix, instances, log) for p, log in zip(ports, logs, strict=True)]
    urls = tuple(f"http://127.0.0.1:{port}" for port in ports)
    try:
        for url, proc, log in zip(urls, procs, logs, strict=True):
            wait_ready(url, proc, log)
        yield urls[0], urls[1]
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)


def test_kv_events_ingested_by_one_replica_change_the_other_replicas_decisions(
    replicas: tuple[str, str],
) -> None:
    a, b = replicas
    before = httpx.post(f"{b}/v1/route", json={"token_ids": PROMPT}).json()
    assert before["predicted_hit"]["md"] == 0.0
    events = [
        {"type": "BlockStored", "block_hashes": [i + 1], "parent_block_hash": i or None,
         "token_ids": PROMPT[16 * i : 16 * (i + 1)], "block_size": 16}
        for i in range(12)
    ]  # fmt: skip
    r = httpx.post(f"{a}/v1/kv-events", json={"instance_id": "md1", "events": events})
    assert r.status_code == 202
    after = httpx.post(f"{b}/v1/route", json={"token_ids": PROMPT}).json()
    assert after["md_instance"] == "md1"
    assert after["predicted_hit"]["md"] == pytest.approx(12 / 16)

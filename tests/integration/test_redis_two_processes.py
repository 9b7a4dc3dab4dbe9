"""Two router processes on one redis-server see each other's updates at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

REDIS_URL = os.environ.get("PDD_ROUTER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

# A worker: one RedisPrefixIndex, driven by JSON lines on stdin, answering on stdout.
WORKER = r"""
import json, os, sys
from policies.tiers import Tier
from router.index.base import IndexedInstance, UnknownInstanceError
from router.index.redis_index import RedisPrefixIndex

index = RedisPrefixIndex(sys.argv[1], key_prefix=sys.argv[2])
print(json.dumps({"pid": os.getpid()}), flush=True)
for line in sys.stdin:
    op, args = json.loads(line)
    try:
        if op == "register":
            index.register(IndexedInstance(args[0], Tier(args[1]), args[2]))
            out = None
        elif op == "match":
            out = index.match(args[0], tier=Tier(args[1]) if args[1] else None)
        else:
            out = getattr(index, op)(*args)
    except UnknownInstanceError as exc:
        out = {"error": str(exc)}
    print(json.dumps(out), flush=True)
"""


class Worker:
    def __init__(self, url: str, prefix: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, url, prefix],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self._read()["pid"]

    def _read(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"worker {self.proc.pid} exited with {self.proc.poll()}"
        return json.loads(line)

    def __call__(self, op: str, *args: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps([op, list(args)]) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


@pytest.fixture
def prefix() -> Iterator[str]:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1.0)
    try:
        client.ping()
    except redis.RedisError:
        pytest.skip(f"no redis-server at {REDIS_URL}")
    name = f"pdd-test:{uuid.uuid4().hex}"
    yield name
    keys = list(client.scan_iter(match=f"{name}:*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.mark.redis
def test_two_processes_see_each_others_updates(prefix: str) -> None:
    a, b = Worker(REDIS_URL, prefix), Worker(REDIS_URL, prefix)
    try:
        assert a.pid != b.pid
        assert os.getpid() not in (a.pid, b.pid)
        chain = list(range(1000, 1040))

        a("register", "p-1", "p", "dc-a")
        a("register", "md-1", "md", "dc-b")
        a("store", "p-1", chain[:30])
        a("store", "md-1", chain[:12])
        assert b("match", chain, None) == {"p-1": 30, "md-1": 12}  # B sees A's stores
        assert b("match", chain, "md") == {"md-1": 12}

        b("remove", "p-1", list(reversed(chain[20:30])))
        assert a("match", chain, None) == {"p-1": 20, "md-1": 12}  # A sees B's removal
        assert a("num_blocks", "p-1") == 20

        b("register", "rld-1", "rld", "dc-a")  # a new instance, named in A's replies
        b("store", "rld-1", chain)
        assert a("match", chain, None) == {"p-1": 20, "md-1": 12, "rld-1": 40}

        a("unregister", "md-1")
        assert b("match", chain, None) == {"p-1": 20, "rld-1": 40}
        assert "md-1" in b("store", "md-1", chain)["error"]
    finally:
        a.close()
        b.close()

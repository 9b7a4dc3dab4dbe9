"""Deciding through a Redis outage: a local view answers, the shared index catches up after."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest

from policies.tiers import Tier
from router.index.base import IndexedInstance
from router.index.redis_index import RedisPrefixIndex
from router.index.resilient_index import ResilientIndex

pytestmark = pytest.mark.redis


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def redis_url() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A private redis-server, so the test can freeze it (SIGSTOP) like a partition."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (make test installs it)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    try:
        yield f"redis://127.0.0.1:{port}/0", proc
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=10)


def test_decisions_continue_during_an_outage_and_the_index_catches_up(
    redis_url: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, server = redis_url
    prefix = f"pdd-test:{uuid.uuid4().hex}"
    clock = Clock()
    shared = RedisPrefixIndex(url, key_prefix=prefix, socket_timeout_s=0.2, retries=0)
    index = ResilientIndex(shared, retry_after_s=1.0, clock=clock)
    index.register(IndexedInstance("md0", Tier.MD, "B"))
    index.store("md0", [1, 2, 3])
    assert index.match([1, 2, 3, 4]) == {"md0": 3}

    server.send_signal(signal.SIGSTOP)  # the network partition
    try:
        assert index.match([1, 2, 3, 4]) == {"md0": 3}  # answered from the local view
        assert index.degraded
        index.store("md0", [1, 2, 3, 4, 5])  # queued for the shared index
        assert index.match([1, 2, 3, 4, 5]) == {"md0": 5}
    finally:
        server.send_signal(signal.SIGCONT)

    clock.now += 2.0  # past the retry delay: the next call replays the queued updates
    assert index.match([1, 2, 3, 4, 5]) == {"md0": 5}
    assert not index.degraded
    other_replica = RedisPrefixIndex(url, key_prefix=prefix)
    assert other_replica.match([1, 2, 3, 4, 5]) == {"md0": 5}

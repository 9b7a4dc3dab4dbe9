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
from router.index.factory import build_index, build_resilient_index
from router.index.redis_index import RedisPrefixIndex
from router.index.resilient_index import ResilientIndex
from router.settings import IndexSettings, RedisSettings

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


def test_a_hung_redis_stalls_a_decision_for_about_one_socket_timeout(
    redis_url: tuple[str, subprocess.Popen[bytes]],
) -> None:
    """With the default settings a frozen Redis costs one short timeout per attempt (not one
    per retry), and calls within the retry delay do not wait for it at all."""
    url, server = redis_url
    redis_settings = RedisSettings(url=url, key_prefix=f"pdd-test:{uuid.uuid4().hex}")
    index_settings = IndexSettings(backend="redis")
    shared = build_index(index_settings, redis_settings)
    index = build_resilient_index(shared, index_settings, redis_settings)
    index.register(IndexedInstance("md0", Tier.MD, "B"))
    index.store("md0", [1, 2, 3])
    server.send_signal(signal.SIGSTOP)
    try:
        start = time.perf_counter()
        assert index.match([1, 2, 3, 4]) == {"md0": 3}  # from the local view
        stalled = time.perf_counter() - start
        start = time.perf_counter()
        assert index.match([1, 2]) == {"md0": 2}
        after = time.perf_counter() - start
    finally:
        server.send_signal(signal.SIGCONT)
    timeout_ms = redis_settings.socket_timeout_s * 1000
    print(f"\nhung Redis: first call {stalled * 1000:.0f} ms (socket timeout {timeout_ms:.0f} ms),"
          f" next {after * 1000:.2f} ms")  # fmt: skip
    assert index.degraded
    assert redis_settings.socket_timeout_s <= stalled < 4 * redis_settings.socket_timeout_s
    assert after < 0.05

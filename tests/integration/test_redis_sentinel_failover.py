"""The shared index through Redis Sentinel: the service decides through a primary failover.

A primary, one replica and three sentinels (quorum 2) run as processes of their own;
the primary is killed (SIGKILL) under steady traffic and the sentinels promote the
replica. The router, which finds the primary through the sentinels, answers from its
local mirror meanwhile and is back on the shared index once the replica is promoted:
the replica holds the replicated index, so nothing has to be written back.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import redis
from test_redis_restart_empty import (
    AUTH,
    OTHER_PROMPT,
    PROMPT,
    VOCAB,
    Engines,
    RedisServer,
    SharedView,
    _holds,
    complete,
    degraded_gauge,
    poll_until,
    register,
    service,
)

from e2e.process_support import free_port, spawn, wait_for
from router.hashing import chain_hashes
from router.index.resilient_index import ResilientIndex

pytestmark = [pytest.mark.redis, pytest.mark.slow]

SERVICE = "pdd-primary"
DOWN_AFTER_MS = 500
FAILOVER_TIMEOUT_MS = 3000
SETUP_BOUND_S = 15.0  # the sentinels find each other (hello messages every 2 s)
PROMOTION_BOUND_S = 15.0  # the kill until a sentinel names the promoted replica
RECOVERY_BOUND_S = 5.0  # the promotion until the router's index is up on it


class SentinelCluster:
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels without persistence, on
    free ports, with the sentinels' configuration and logs in ``folder``; stopped by PID."""

    def __init__(
        self, binary: str, folder: Path, *, sentinels: int, replicas: int, password: str
    ) -> None:
        self.binary = binary
        self.folder = folder
        self.password = password
        self.primary = RedisServer(binary)
        self.replicas = [RedisServer(binary) for _ in range(replicas)]
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.sentinels: list[subprocess.Popen[bytes]] = []
        self._clients: dict[int, redis.Redis] = {}

    def url(self, password: str = "") -> str:
        auth = f":{password}@" if password else ""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{auth}{hosts}/{SERVICE}/0"

    def client(self, port: int) -> redis.Redis:
        """A client of the Redis or sentinel on ``port`` (closed by ``stop``)."""
        if port not in self._clients:
            password = None if port in self.sentinel_ports else self.password or None
            self._clients[port] = redis.Redis(port=port, password=password, socket_timeout=1)
        return self._clients[port]

    def start(self) -> None:
        for server in (self.primary, *self.replicas):
            server.start()
            with redis.Redis(port=server.port, socket_timeout=1) as node:
                # the primary sends its data over the socket, the replica loads it from
                # there: no RDB file is written (they run in the test's working directory)
                node.config_set("repl-diskless-sync", "yes")
                node.config_set("repl-diskless-load", "on-empty-db")
                if self.password:
                    node.config_set("masterauth", self.password)
                    node.config_set("requirepass", self.password)
        for replica in self.replicas:
            self.client(replica.port).replicaof("127.0.0.1", self.primary.port)
            poll_until(functools.partial(self._synced, replica.port), 10.0, "the replica to sync")
        for i in range(len(self.sentinel_ports)):
            self._start_sentinel(i)
        try:
            poll_until(self._settled, SETUP_BOUND_S, "the sentinels to know each other")
        except AssertionError as exc:
            states = {port: self._state(port) for port in self.sentinel_ports}
            raise AssertionError(f"{exc}; what they see: {states}") from None

    def _start_sentinel(self, i: int) -> None:
        """Sentinel ``i`` on its port, or on another one when that port was taken meanwhile."""
        for _ in range(3):
            port = self.sentinel_ports[i]
            conf = self.folder / f"sentinel-{port}.conf"
            lines = [
                f"port {port}",
                "bind 127.0.0.1",
                f"dir {self.folder}",
                f"logfile {self.folder / f'sentinel-{port}.log'}",
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} "
                f"{len(self.sentinel_ports) // 2 + 1}",
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}",
                f"sentinel parallel-syncs {SERVICE} 1",
            ]
            if self.password:
                lines.append(f"sentinel auth-pass {SERVICE} {self.password}")
            conf.write_text("\n".join(lines) + "\n")
            command = [self.binary, str(conf), "--sentinel"]
            proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.sentinels.append(proc)
            poll_until(functools.partial(self._started, port, proc), 10.0, "a sentinel")
            if proc.poll() is None:
                return
            self.sentinel_ports[i] = free_port()
        raise AssertionError(f"no sentinel started, see {self.folder}")

    def _started(self, port: int, proc: subprocess.Popen[bytes]) -> bool:
        """Whether ``proc`` answers on ``port``, or exited (the port was taken)."""
        if proc.poll() is not None:
            return True
        try:
            return bool(self.client(port).info("server")["process_id"] == proc.pid)
        except redis.RedisError:
            return False

    def _state(self, port: int) -> dict[str, object] | str:
        try:
            state = cast(dict[str, Any], self.client(port).sentinel_master(SERVICE))
        except redis.RedisError as exc:
            return repr(exc)
        keys = ("port", "flags", "num-slaves", "num-other-sentinels")
        return {key: state.get(key) for key in keys}

    def _synced(self, port: int) -> bool:
        info = self.client(port).info("replication")
        return bool(info.get("master_link_status") == "up")

    def _settled(self) -> bool:
        """Every sentinel sees the primary, its replicas and the other sentinels."""
        for port in self.sentinel_ports:
            try:
                state = cast(dict[str, Any], self.client(port).sentinel_master(SERVICE))
            except redis.RedisError:
                return False
            if (
                state["num-other-sentinels"] < len(self.sentinel_ports) - 1
                or state["num-slaves"] < len(self.replicas)
                or state["port"] != self.primary.port
            ):
                return False
        return True

    def primary_port(self) -> int | None:
        """The primary's port as the first sentinel that answers names it now."""
        for port in self.sentinel_ports:
            try:
                found = cast(
                    tuple[str, int] | None,
                    self.client(port).sentinel_get_master_addr_by_name(SERVICE),
                )
            except redis.RedisError:
                continue
            return None if found is None else int(found[1])
        return None

    def stop(self) -> None:
        for client in self._clients.values():
            client.close()
        for proc in self.sentinels:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.sentinels:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for server in (self.primary, *self.replicas):
            try:
                server.stop()
            except subprocess.TimeoutExpired:
                assert server.proc is not None
                server.proc.kill()
                server.proc.wait(timeout=5)


def _cluster(
    folder: Path, *, sentinels: int, replicas: int, password: str = ""
) -> Iterator[SentinelCluster]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (make test installs it)")
    cluster = SentinelCluster(
        binary, folder, sentinels=sentinels, replicas=replicas, password=password
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@contextlib.contextmanager
def shared_view(url: str, prefix: str) -> Iterator[SharedView]:
    """What another replica reads from the shared index, through the sentinels."""
    view = SharedView(url, prefix)
    try:
        yield view
    finally:
        view.index.close()


@pytest.fixture
def sentinel_cluster(tmp_path: Path) -> Iterator[SentinelCluster]:
    """A primary, one replica and three sentinels, quorum 2."""
    yield from _cluster(tmp_path, sentinels=3, replicas=1)


def test_the_service_decides_through_a_primary_failover(
    sentinel_cluster: SentinelCluster,
) -> None:
    """The primary killed under traffic: every completion is answered 200, decisions come
    from the local mirror while there is no primary, the index is up on the promoted
    replica within a bounded time and still matches what was stored before the kill."""
    cluster = sentinel_cluster
    url = cluster.url()
    prefix = f"pdd-test:{uuid.uuid4().hex}"
    chain = chain_hashes(PROMPT, 16, 0).hashes
    index = {"index": {"backend": "redis"}, "redis": {"url": url, "key_prefix": prefix}}
    with shared_view(url, prefix) as shared, service(Engines(), **index) as client:
        svc_index = client.app_state["svc"].index
        assert isinstance(svc_index, ResilientIndex)
        register(client)
        first = complete(client, PROMPT)
        assert first.status_code == 200, first.text
        served = first.json()["pdd"]["instances"]
        held = {served["p"]: 40, served["md"]: 40}
        poll_until(lambda: _holds(shared.match(chain), held), 5.0, "KV events in Redis")
        primary = cluster.client(cluster.primary.port)
        generation = primary.get(f"{prefix}:generation")
        assert generation is not None
        assert primary.wait(1, 2000) == 1  # the replica has every write so far

        statuses: list[tuple[float, int]] = []  # (time, status) of every completion
        samples: list[tuple[float, float]] = []  # (time, degraded gauge)
        prompts: list[list[int]] = []

        def step() -> None:
            # a new prompt of 3 blocks each time (new KV events to write), few enough
            # blocks in all that the engines' caches keep PROMPT's
            n = len(prompts)
            prompts.append([n % VOCAB, n // VOCAB % VOCAB, *OTHER_PROMPT[: 3 * 16 - 2]])
            statuses.append((time.perf_counter(), complete(client, prompts[-1]).status_code))
            samples.append((time.perf_counter(), degraded_gauge(client)))

        end = time.perf_counter() + 1.0
        while time.perf_counter() < end:  # steady traffic before the kill
            step()
        assert {s for _, s in statuses} == {200}

        killed = time.perf_counter()
        cluster.primary.kill()
        promoted: float | None = None  # when a sentinel first names the replica
        degraded_from: float | None = None  # the first sample saying degraded
        up: float | None = None  # the first sample not degraded after it, once promoted
        deadline = killed + PROMOTION_BOUND_S + RECOVERY_BOUND_S
        while up is None:
            assert time.perf_counter() < deadline, (
                f"no failover, or the index never came back: promoted={promoted}, "
                f"degraded_from={degraded_from}, stats={svc_index.stats}"
            )
            step()
            if promoted is None and cluster.primary_port() == cluster.replicas[0].port:
                promoted = time.perf_counter()
            at, degraded = samples[-1]
            if degraded_from is None and degraded == 1.0:
                degraded_from = at
            elif degraded_from is not None and promoted is not None and degraded == 0.0:
                up = at
        end = time.perf_counter() + 0.5
        while time.perf_counter() < end:  # and steady traffic after it
            step()

        assert promoted is not None
        assert degraded_from is not None
        during = [s for t, s in statuses if killed < t <= up]
        print(
            f"\nSentinel failover: promotion {promoted - killed:.2f} s after the kill; "
            f"index up on the new primary {up - killed:.2f} s after the kill "
            f"({up - promoted:.2f} s after the promotion), degraded for "
            f"{up - degraded_from:.2f} s (from {degraded_from - killed:.2f} s after the "
            f"kill); {len(during)} completions meanwhile, "
            f"{len(statuses)} in all, statuses {sorted({s for _, s in statuses})}, "
            f"index stats {svc_index.stats}"
        )
        assert all(s < 500 for _, s in statuses), statuses  # never a 5xx
        assert {s for _, s in statuses} == {200}
        assert len(during) >= 5  # decided from the local mirror while there was no primary
        assert promoted - killed < PROMOTION_BOUND_S
        assert up - promoted < RECOVERY_BOUND_S
        assert all(g == 0.0 for t, g in samples if t > up)  # and it stays up

        ready = client.get("/readyz").json()
        assert ready["index_degraded"] is False
        assert ready["index_state"] == "up"
        # The promoted replica holds what was stored before the kill: the router wrote
        # nothing back (same generation token, no rebuild), and it still matches.
        new_primary = cluster.client(cluster.replicas[0].port)
        assert new_primary.info("replication")["role"] == "master"
        assert new_primary.get(f"{prefix}:generation") == generation
        assert svc_index.stats.rebuilds == 0
        assert svc_index.stats.outages == 1
        assert _holds(shared.match(chain), held)
        # what was served while there was no primary was queued, then written to the new one
        assert svc_index.stats.replayed_updates > 0
        outage = [p for (t, _), p in zip(statuses, prompts, strict=True) if killed < t < up]
        three = {served["p"]: 3, served["md"]: 3}
        for prompt in (outage[0], outage[len(outage) // 2], outage[-1]):
            assert _holds(shared.match(chain_hashes(prompt, 16, 0).hashes), three), prompt
        route = client.post("/v1/route", json={"token_ids": PROMPT}, headers=AUTH).json()
        # the chain from before, as the engine serves it: 624 of 640 (never the last token)
        assert route["predicted_hit"]["md"] == pytest.approx(624 / 640)


PASSWORD = "s3cret-sentinel"


@pytest.fixture
def guarded_primary(tmp_path: Path) -> Iterator[SentinelCluster]:
    """A primary with a password and one sentinel watching it."""
    yield from _cluster(tmp_path, sentinels=1, replicas=0, password=PASSWORD)


def test_serve_decides_through_the_sentinels(
    guarded_primary: SentinelCluster, tmp_path: Path
) -> None:
    """`pdd-router serve` configured by environment with a Sentinel URL (the password is
    the primary's) registers its instances and stores what it serves in the primary."""
    cluster = guarded_primary
    prefix = f"pdd-test:{uuid.uuid4().hex}"
    instances = tmp_path / "instances.yaml"
    instances.write_text(
        "- {instance_id: p0, tier: p, datacenter: A, adapter: sim}\n"
        "- {instance_id: md0, tier: md, datacenter: B, adapter: sim}\n"
    )
    env = {
        "PDD_ROUTER_INDEX__BACKEND": "redis",
        "PDD_ROUTER_REDIS__URL": cluster.url(PASSWORD),
        "PDD_ROUTER_REDIS__KEY_PREFIX": prefix,
        "PDD_ROUTER_SERVICE__SHOW_SHARED_PREDICTIONS": "true",
    }
    port = free_port()
    log = tmp_path / "router.log"
    args = ["serve", "--port", str(port), "--instances", str(instances), "--log-level", "info"]
    proc = spawn(args, log, env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(f"{base}/readyz", [(proc, log)], limit_s=30)
        body = {"prompt": PROMPT[:320], "max_tokens": 4}
        answer = httpx.post(f"{base}/v1/completions", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        ready = httpx.get(f"{base}/readyz", timeout=5).json()
        assert (ready["index"], ready["index_state"]) == ("redis", "up")
        primary = cluster.client(cluster.primary.port)
        registered = primary.hkeys(f"{prefix}:instances")
        assert sorted(registered) == [b"md0", b"p0"]
        chain = chain_hashes(PROMPT[:320], 16, 0).hashes
        with shared_view(cluster.url(PASSWORD), prefix) as shared:
            poll_until(lambda: _holds(shared.match(chain), {"md0": 20}), 5.0, "KV events")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    assert PASSWORD not in log.read_text()

"""The shared index on a real Redis Cluster: three primaries started here, each index's
keys in the one slot of its key prefix's hash tag, a match still one call to one node,
and the service deciding through it with replicas sharing their load."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from redis.cluster import RedisCluster

from e2e.process_support import free_port, spawn, wait_for
from policies.tiers import Tier
from router.index.base import IndexedInstance
from router.index.redis_index import RedisPrefixIndex

pytestmark = [pytest.mark.redis, pytest.mark.slow]

CHAIN = list(range(1000, 1064))


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    for _ in range(100):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise AssertionError("no free port pair for a cluster node")


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    """Three cluster primaries (no replicas, nothing on disk); their ports."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        pytest.skip("redis-server is not installed (make test installs it)")
    folder = tmp_path_factory.mktemp("cluster")
    ports = [_cluster_port() for _ in range(3)]
    procs = []
    try:
        for port in ports:
            node = folder / str(port)
            node.mkdir()
            procs.append(subprocess.Popen(
                [server, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-config-file", "nodes.conf", "--save", "", "--appendonly", "no",
                 "--dir", str(node)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))  # fmt: skip
        for port in ports:
            _until(lambda p=port: _answers(p), 10, f"cluster node on {port}")
        subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        _until(lambda: all(_cluster_ok(p) for p in ports), 20, "the cluster to be ok")
        yield ports
    finally:
        _stop(procs)


def _answers(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port, socket_timeout=0.5).ping())
    except redis.RedisError:
        return False


def _cluster_ok(port: int) -> bool:
    info = redis.Redis(port=port, socket_timeout=0.5).cluster("info")
    if isinstance(info, dict):
        state = info.get("cluster_state")
        return state in ("ok", b"ok")
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "cluster_state:ok" in text


def _until(check: object, limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if callable(check) and check():
            return
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {limit_s} s")


def url_of(ports: list[int]) -> str:
    return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports[:2])


def evalsha_calls(client: RedisCluster) -> dict[str, int]:
    """EVALSHA calls so far, per node."""
    out = {}
    for node in client.get_primaries():
        stats = client.info("commandstats", target_nodes=node)
        out[node.name] = int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    return out


def test_an_index_on_the_cluster_lives_in_one_slot_and_matches_in_one_call(
    cluster: list[int],
) -> None:
    index = RedisPrefixIndex(url_of(cluster), key_prefix="pdd-cluster")
    assert index.key_prefix == "{pdd-cluster}"  # a hash tag: every key in one slot
    try:
        index.register(IndexedInstance("p0", Tier.P, "A"))
        index.register(IndexedInstance("md0", Tier.MD, "B"))
        index.store("p0", CHAIN)
        index.store("md0", CHAIN[:16])
        client = RedisCluster(host="127.0.0.1", port=cluster[0])
        index.match(CHAIN[:1])  # the node loads the script on its first call
        before = evalsha_calls(client)
        assert index.match(CHAIN) == {"p0": 64, "md0": 16}
        after = evalsha_calls(client)
        grew = {name: after[name] - before[name] for name in after if after[name] != before[name]}
        assert list(grew.values()) == [1], grew  # one script call, on one node
        keys = [k.decode() for k in client.scan_iter(match="{pdd-cluster}:*")]
        assert len(keys) > 64
        assert len({client.keyslot(k) for k in keys}) == 1
        index.remove("p0", CHAIN[32:])
        assert index.match(CHAIN) == {"p0": 32, "md0": 16}
    finally:
        index.delete_all_keys()
        index.close()


def test_indexes_of_different_models_spread_over_the_nodes(cluster: list[int]) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster[0])
    owner = {}
    for model in ("llama", "qwen", "mistral", "gemma", "phi", "deepseek"):
        slot = client.keyslot(f"{{{model}}}:instances")
        owner[model] = client.nodes_manager.get_node_from_slot(slot).name
    assert len(set(owner.values())) >= 2, owner  # hash tags spread models over nodes
    indexes = [RedisPrefixIndex(url_of(cluster), key_prefix=m) for m in owner]
    try:
        for index in indexes:
            index.register(IndexedInstance("p0", Tier.P, "A"))
            index.store("p0", CHAIN[:8])
        for model, index in zip(owner, indexes, strict=True):
            assert index.match(CHAIN) == {"p0": 8}
            node = client.get_node_from_key(f"{{{model}}}:instances")
            direct = redis.Redis(host=node.host, port=node.port)
            assert direct.exists(f"{{{model}}}:instances")  # on the node of its hash tag
            direct.close()
    finally:
        for index in indexes:
            index.delete_all_keys()
            index.close()


def _settled_holder(client: RedisCluster, instance: str) -> str:
    """The replica holding ``instance``'s ingest lease once the two replicas have split
    the leases (one each)."""
    deadline = time.monotonic() + 15
    while True:
        held = [client.get(f"{{svc-cluster}}:ingest:{iid}") for iid in ("p0", "md0")]
        if None not in held and held[0] != held[1]:
            holder = client.get(f"{{svc-cluster}}:ingest:{instance}")
            assert holder is not None
            return holder.decode() if isinstance(holder, bytes) else str(holder)
        assert time.monotonic() < deadline, f"the replicas did not split the leases: {held}"
        time.sleep(0.1)


def test_the_service_decides_through_the_cluster(cluster: list[int], tmp_path: Path) -> None:
    instances = tmp_path / "instances.yaml"
    instances.write_text(
        "- {instance_id: p0, tier: p, datacenter: A, adapter: sim}\n"
        "- {instance_id: md0, tier: md, datacenter: B, adapter: sim}\n"
    )
    env = {
        "PDD_ROUTER_INDEX__BACKEND": "redis",
        "PDD_ROUTER_REDIS__URL": url_of(cluster),
        "PDD_ROUTER_REDIS__KEY_PREFIX": "svc-cluster",
        "PDD_ROUTER_SERVICE__SHOW_SHARED_PREDICTIONS": "true",
        "PDD_ROUTER_POLICY__NAME": "pdd",
        "PDD_ROUTER_POLICY__PARAMS": json.dumps({"wan_budget_s": 1e6}),
    }
    procs = []
    try:
        urls = []
        for n in range(2):  # two replicas: their load exchange runs on the cluster too
            port = free_port()
            log = tmp_path / f"router-{n}.log"
            args = ["serve", "--port", str(port), "--instances", str(instances),
                    "--log-level", "warning"]  # fmt: skip
            named = {**env, "PDD_ROUTER_REPLICAS__REPLICA_ID": f"r{n}"}
            procs.append((spawn(args, log, named), log))
            urls.append(f"http://127.0.0.1:{port}")
        for url in urls:
            wait_for(f"{url}/readyz", procs)
        # Each replica has in-process engines of its own, and only the holder of p0's
        # ingest lease writes p0's events: serve on that replica, ask the other
        writer = _settled_holder(RedisCluster(host="127.0.0.1", port=cluster[0]), "p0")
        served, other = (urls[0], urls[1]) if writer == "r0" else (urls[1], urls[0])
        prompt = [(3 * i + 1) % 512 for i in range(512)]
        body = {"prompt": prompt, "max_tokens": 2, "ignore_eos": True}
        response = httpx.post(f"{served}/v1/completions", json=body, timeout=30)
        assert response.status_code == 200, response.text
        # the other replica predicts the hit from the KV events the cluster holds
        deadline = time.monotonic() + 10
        hit = 0.0
        while time.monotonic() < deadline and hit < 0.9:
            route = httpx.post(f"{other}/v1/route", json={"token_ids": prompt}, timeout=10)
            assert route.status_code == 200, route.text
            hit = route.json()["predicted_hit"]["p"]
            time.sleep(0.1)
        assert hit > 0.9
        ready = httpx.get(f"{other}/readyz", timeout=5).json()
        assert not ready["index_degraded"], ready
    finally:
        _stop([proc for proc, _ in procs])
        client = RedisCluster(host="127.0.0.1", port=cluster[0])
        for key in client.scan_iter(match="{svc-cluster}:*"):
            client.delete(key)

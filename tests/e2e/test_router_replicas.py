"""Three router replicas on one Redis behave as one router: a burst sent round robin over
them spreads over the prefill instances as it does through a single replica, and Redis
receives each engine's KV events once, however many replicas there are.

Real processes: engine-sim servers behind the vLLM adapter publishing KV events over
ZMQ, `pdd-router serve` replicas, a private redis-server. Every figure is printed
(``pytest -s``). A control run of three replicas that do not share (``replicas.share``
off) shows what the test would catch: each replica then sends its part of the burst to
the same idle instances, and Redis gets every KV event three times.
"""

from __future__ import annotations

import collections
import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import redis
from process_support import RedisServer, Stack

pytestmark = pytest.mark.slow

PREFIX_TOKENS = 1024  # 64 blocks of 16 shared by the whole burst
BURST = 6
HELD = 3  # the burst's first requests, one per replica: decided while no P has computed
STAGGER_S = 0.05  # the burst's requests arrive 50 ms apart
P_IDS = ("p0", "p1", "p2")
ENGINE_BLOCKS = (PREFIX_TOKENS + 16) // 16  # blocks a request stores on an empty instance


@dataclass
class Replicas:
    stack: Stack
    urls: list[str]
    procs: list[subprocess.Popen[bytes]]
    prefix: str

    def stop(self) -> None:
        """Stop them (they would keep writing their KV events to Redis)."""
        for proc in self.procs:
            self.stack.stop(proc)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, RedisServer]]:
    """Three P engines that take ~1 s to prefill the burst's prompt, one MD."""
    stack = Stack(tmp_path_factory.mktemp("replicas"))
    server = RedisServer.start()
    try:
        for iid in ("p0", "p1", "p2"):
            stack.engine(iid, "p", "--prefill-us-per-token", "1000")
        stack.engine("md0", "md", "--decode-ms", "1", "--max-running", "64")
        yield stack, server
    finally:
        stack.close()
        server.stop()


def start_replicas(
    stack: Stack, server: RedisServer, n: int, *, share: bool, env: dict[str, str] | None = None
) -> Replicas:
    """``n`` replicas on a key prefix of their own (``env`` may name another)."""
    env = {
        "PDD_ROUTER_INDEX__BACKEND": "redis",
        "PDD_ROUTER_REDIS__URL": server.url,
        "PDD_ROUTER_REPLICAS__SHARE": "true" if share else "false",
        "PDD_ROUTER_SERVICE__SHOW_SHARED_PREDICTIONS": "true",
        "PDD_ROUTER_SERVICE__ENGINE_TIMEOUT_S": "20",
        "PDD_ROUTER_POLICY__NAME": "pdd",
        "PDD_ROUTER_POLICY__PARAMS": json.dumps({"wan_budget_s": 1e6}),  # P-MD only
        "PDD_ROUTER_REDIS__KEY_PREFIX": f"pdd-replicas:{uuid.uuid4().hex[:8]}",
        # Redis is not what is tested: a loaded machine must not look like an outage (on
        # one, a replica decides alone for retry_after_s), so a reply may take 2 s
        "PDD_ROUTER_REDIS__SOCKET_TIMEOUT_S": "2",
        **(env or {}),
    }
    prefix = env["PDD_ROUTER_REDIS__KEY_PREFIX"]
    urls = [stack.start_router(env) for _ in range(n)]
    procs = [proc for proc, _ in stack.procs[-n:]]
    if share and n > 1:  # every replica has seen the others (a heartbeat each)
        deadline = time.time() + 10
        while time.time() < deadline:
            if all(replicas_seen(url) == n for url in urls):
                break
            time.sleep(0.1)
        else:
            seen = [replicas_seen(url) for url in urls]
            raise AssertionError(f"replicas never saw each other: {seen}")
    return Replicas(stack, urls, procs, prefix)


def replicas_seen(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith("pdd_router_replicas "):
            return float(line.split()[1])
    return 0.0


def hold(stack: Stack, held: bool) -> None:
    """Hold (or let go) the prefills the P engines are sent: held, a request is admitted
    and counted running, and computes nothing (so no P ends one or caches its prefix)."""
    for iid in P_IDS:
        faults = {"hold": held}
        httpx.post(
            f"{stack.engines[iid].url}/sim/faults", json=faults, timeout=5
        ).raise_for_status()


def wait_running(stack: Stack, n: int) -> None:
    """Until the P engines run ``n`` requests between them (each one was decided)."""
    deadline = time.monotonic() + 30
    running = 0.0
    while time.monotonic() < deadline:
        running = sum(stack.engines[iid].running() for iid in P_IDS)
        if running >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"the P engines run {running} requests, never {n}")


def burst(replicas: Replicas, seed: int) -> list[str]:
    """BURST requests sharing one prefix, round robin over the replicas, STAGGER_S apart;
    the P instance that served each, in order of arrival. The first HELD are all decided
    before any P computes: each finds every earlier one in prefill, however slowly the
    machine runs them (left to the clock, a first prefill that ended before the third
    request was decided made p0 idle, holding the prefix, and rightly chosen again)."""
    shared = [(seed * 37 + 11 * i) % 512 for i in range(PREFIX_TOKENS)]
    served: list[str] = [""] * BURST
    errors: list[str] = []

    def send(k: int) -> None:
        tail = [(seed + 13 * k + j) % 512 for j in range(16)]
        body = {"prompt": shared + tail, "max_tokens": 4, "ignore_eos": True}
        url = replicas.urls[k % len(replicas.urls)]
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        if response.status_code != 200:
            errors.append(f"{response.status_code} {response.text[:200]}")
            return
        served[k] = response.json()["pdd"]["instances"]["p"]

    threads = []
    hold(replicas.stack, True)
    try:
        for k in range(BURST):
            thread = threading.Thread(target=send, args=(k,))
            thread.start()
            threads.append(thread)
            if k == HELD - 1:
                wait_running(replicas.stack, HELD)
                hold(replicas.stack, False)
            time.sleep(STAGGER_S)
    finally:
        hold(replicas.stack, False)
    for thread in threads:
        thread.join(timeout=90)
    assert not errors, errors
    return served


def block_writes(server: RedisServer, replicas: Replicas, seed: int) -> tuple[list[str], int]:
    """A burst through ``replicas``, then the SETBIT calls Redis ran meanwhile (one per
    block an instance is recorded to hold), counted once the last KV events arrived."""
    client = redis.Redis.from_url(server.url)
    try:
        client.config_resetstat()
        served = burst(replicas, seed)
        time.sleep(1.5)
        stats = client.info("commandstats")
    finally:
        client.close()
    replicas.stop()
    return served, int(stats.get("cmdstat_setbit", {}).get("calls", 0))


def test_replicas_spread_a_burst_and_write_kv_events_once(
    cluster: tuple[Stack, RedisServer],
) -> None:
    stack, server = cluster
    alone, alone_writes = block_writes(server, start_replicas(stack, server, 1, share=True), 1)
    shared, shared_writes = block_writes(server, start_replicas(stack, server, 3, share=True), 2)
    unshared, unshared_writes = block_writes(
        server, start_replicas(stack, server, 3, share=False), 3
    )

    runs = {"one replica": alone, "three sharing": shared, "three alone": unshared}
    writes = {"one replica": alone_writes, "three sharing": shared_writes,
              "three alone": unshared_writes}  # fmt: skip
    for name, run in runs.items():
        counts = dict(sorted(collections.Counter(run).items()))
        print(f"{name}: P instances in order {run} {counts}, Redis block writes {writes[name]}")

    # the burst's first three requests (one per replica, each decided while the earlier
    # ones wait at their P) find every P idle: one replica sends them to three different
    # instances, and so do three sharing replicas
    assert len(set(alone[:3])) == 3, alone
    assert len(set(shared[:3])) == 3, shared
    assert set(shared) == {"p0", "p1", "p2"}, shared
    # every request's blocks reached Redis, once: as many block writes as with one replica
    # (each P stores the prefix once and a tail block per request; MD the same)
    assert alone_writes >= 4 * ENGINE_BLOCKS
    assert abs(shared_writes - alone_writes) <= alone_writes // 10, writes
    # the control: replicas that do not share each send their first request to the same
    # idle instance, and every KV event is written three times (fewer distinct blocks are
    # stored, since fewer instances computed the prefix: at least twice as many writes)
    assert len(set(unshared[:3])) == 1, unshared
    assert unshared_writes >= 2 * alone_writes, writes


def predicted_md_hit(url: str, prompt: list[int]) -> float:
    response = httpx.post(f"{url}/v1/route", json={"token_ids": prompt}, timeout=10)
    assert response.status_code == 200, response.text
    hit: float = response.json()["predicted_hit"].get("md", 0.0)
    return hit


def test_a_killed_replicas_kv_events_are_written_by_another(
    cluster: tuple[Stack, RedisServer],
) -> None:
    """SIGKILL the replica that writes md0's KV events to Redis: within its lease's ttl
    another replica takes md0 over and writes the events it kept meanwhile, so a prompt
    served right after the kill is predicted as cached by every surviving replica."""
    stack, server = cluster
    replicas = start_replicas(stack, server, 3, share=True)
    client = redis.Redis.from_url(server.url)
    try:
        holder = client.get(f"{replicas.prefix}:ingest:md0")
        assert holder is not None
        pid = int(holder.decode().split(":")[1])  # type: ignore[union-attr]  # bytes: no decode_responses  # replica ids are host:pid:random
        victim = next(i for i, proc in enumerate(replicas.procs) if proc.pid == pid)
        replicas.procs[victim].kill()
        killed = time.monotonic()
        survivors = [url for i, url in enumerate(replicas.urls) if i != victim]
        prompt = [(71 * i + 5) % 512 for i in range(PREFIX_TOKENS)]
        body = {"prompt": prompt, "max_tokens": 2, "ignore_eos": True}
        response = httpx.post(f"{survivors[0]}/v1/completions", json=body, timeout=30)
        assert response.status_code == 200, response.text
        assert response.json()["pdd"]["instances"]["md"] == "md0"
        served = time.monotonic() - killed
        hits = [0.0, 0.0]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and min(hits) < 0.9:
            hits = [predicted_md_hit(url, prompt) for url in survivors]
            time.sleep(0.1)
        seen = time.monotonic() - killed
        new_holder = client.get(f"{replicas.prefix}:ingest:md0")
        print(f"\nreplica killed: the prompt served {served:.2f} s after, md0's blocks "
              f"predicted by both survivors {seen:.2f} s after the kill")  # fmt: skip
        assert min(hits) > 0.9, hits
        assert new_holder is not None
        assert new_holder != holder  # a survivor writes md0's events now
    finally:
        client.close()
        replicas.procs = [p for p in replicas.procs if p.poll() is None]
        replicas.stack.procs = [(p, log) for p, log in replicas.stack.procs if p.poll() is None]
        replicas.stop()


def test_a_replica_restarted_after_events_it_missed_clears_what_redis_kept(
    cluster: tuple[Stack, RedisServer],
) -> None:
    """The only replica is killed; while it is down md0 drops its whole cache, and that
    event reaches no one. The replica started again finds md0's lease unheld for longer
    than it has been listening: it clears md0 in Redis rather than keep predicting the
    blocks Redis still names (every one of them evicted), and the next prompts are
    predicted from md0's events again."""
    stack, server = cluster
    first = start_replicas(stack, server, 1, share=True)
    prompt = [(53 * i + 9) % 512 for i in range(PREFIX_TOKENS)]
    body = {"prompt": prompt, "max_tokens": 2, "ignore_eos": True}
    response = httpx.post(f"{first.urls[0]}/v1/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["pdd"]["instances"]["md"] == "md0"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and predicted_md_hit(first.urls[0], prompt) < 0.9:
        time.sleep(0.1)
    assert predicted_md_hit(first.urls[0], prompt) > 0.9
    client = redis.Redis.from_url(server.url)
    old = client.get(f"{first.prefix}:ingest:md0")
    assert old is not None
    first.procs[0].kill()
    first.procs[0].wait(10)
    stack.procs = [(p, log) for p, log in stack.procs if p.poll() is None]
    reset = httpx.post(f"{stack.engines['md0'].url}/reset_prefix_cache", timeout=10)
    assert reset.status_code == 200
    env = {"PDD_ROUTER_REDIS__KEY_PREFIX": first.prefix}
    again = start_replicas(stack, server, 1, share=True, env=env)
    try:
        started = time.monotonic()
        hit = 1.0
        while time.monotonic() - started < 15:  # the old lease lapses (ttl 3 s), then taken
            holder = client.get(f"{first.prefix}:ingest:md0")
            hit = predicted_md_hit(again.urls[0], prompt)
            if holder is not None and holder != old and hit == 0.0:
                break
            time.sleep(0.2)
        cleared_after = time.monotonic() - started
        print(f"\nrestarted replica: md0 cleared in Redis {cleared_after:.1f} s after start")
        assert hit == 0.0  # before: 1.0, from the blocks Redis kept
        gaps = [
            line for line in httpx.get(f"{again.urls[0]}/metrics", timeout=5).text.splitlines()
            if line.startswith('pdd_router_kv_event_gaps_total{instance="md0"}')
        ]  # fmt: skip
        assert gaps, "the clear is counted as a gap of md0"
        assert float(gaps[0].split()[1]) >= 1
        fresh = [(59 * i + 3) % 512 for i in range(PREFIX_TOKENS)]
        body = {"prompt": fresh, "max_tokens": 2, "ignore_eos": True}
        response = httpx.post(f"{again.urls[0]}/v1/completions", json=body, timeout=30)
        assert response.status_code == 200, response.text
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and predicted_md_hit(again.urls[0], fresh) < 0.9:
            time.sleep(0.1)
        assert predicted_md_hit(again.urls[0], fresh) > 0.9
    finally:
        client.close()
        again.stop()

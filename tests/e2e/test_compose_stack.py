"""docker-compose.yml, running: two router replicas on one Redis index, simulated P / RLD / MD.

`make compose-test` (scripts/compose-test.sh) builds the image, starts the stack in Docker,
runs this file against it and removes the stack. It sets:

- PDD_ROUTER_COMPOSE_URLS       the routers' base URLs, comma-separated (one per replica)
- PDD_ROUTER_COMPOSE_API_KEY    the stack's client key; PDD_ROUTER_COMPOSE_METRICS_KEY its
  metrics key, PDD_ROUTER_COMPOSE_ADMIN_KEY its admin key
- PDD_ROUTER_COMPOSE_REDIS_URL  the stack's Redis, published on a loopback port

Without them (as in `make test`) every test here is skipped.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

import httpx
import pytest
import redis

URLS = [u for u in os.environ.get("PDD_ROUTER_COMPOSE_URLS", "").split(",") if u]
KEY = os.environ.get("PDD_ROUTER_COMPOSE_API_KEY", "")
METRICS_KEY = os.environ.get("PDD_ROUTER_COMPOSE_METRICS_KEY", "")
ADMIN_KEY = os.environ.get("PDD_ROUTER_COMPOSE_ADMIN_KEY", "")
REDIS_URL = os.environ.get("PDD_ROUTER_COMPOSE_REDIS_URL", "")
PREFIX = "pdd"  # redis.key_prefix in docker-compose.yml

pytestmark = pytest.mark.skipif(
    not (URLS and KEY and METRICS_KEY and ADMIN_KEY and REDIS_URL),
    reason="needs the running compose stack: make compose-test",
)

TIMEOUT = httpx.Timeout(30.0, connect=5.0)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def prompt(seed: int, n: int) -> list[int]:
    """A token-ID prompt (the stack's vocabulary is 512 tokens)."""
    return [(seed * 31 + 7 * i) % 512 for i in range(n)]


def complete(url: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json=body, headers=auth(KEY), timeout=TIMEOUT)


def poll(check: Callable[[], object], seconds: float) -> bool:
    """Call ``check`` until it is true, for at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        if check():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def test_there_are_two_replicas() -> None:
    assert len(URLS) == 2


@pytest.mark.parametrize("url", URLS)
def test_each_replica_is_ready_without_a_key(url: str) -> None:
    assert httpx.get(f"{url}/healthz", timeout=TIMEOUT).status_code == 200
    ready = httpx.get(f"{url}/readyz", timeout=TIMEOUT)
    assert ready.status_code == 200, ready.text


@pytest.mark.parametrize("url", URLS)
def test_a_request_without_the_key_gets_401(url: str) -> None:
    body = {"prompt": prompt(1, 64), "max_tokens": 4}
    no_key = httpx.post(f"{url}/v1/completions", json=body, timeout=TIMEOUT)
    assert no_key.status_code == 401, no_key.text
    wrong = httpx.post(f"{url}/v1/completions", json=body, headers=auth("x" + KEY),
                       timeout=TIMEOUT)  # fmt: skip
    assert wrong.status_code == 401
    # the metrics key opens /metrics and nothing else: a known key without the role, 403
    scrape_key = httpx.post(f"{url}/v1/completions", json=body, headers=auth(METRICS_KEY),
                            timeout=TIMEOUT)  # fmt: skip
    assert scrape_key.status_code == 403, scrape_key.text
    assert httpx.get(f"{url}/metrics", timeout=TIMEOUT).status_code == 401


def test_completions_through_each_replica_agree() -> None:
    outputs: dict[str, list[list[int]]] = {}
    for url in URLS:
        outputs[url] = []
        for seed, length, n in [(2, 64, 8), (3, 200, 16), (4, 480, 32)]:
            r = complete(url, {"prompt": prompt(seed, length), "max_tokens": n})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["usage"]["completion_tokens"] == n
            assert len(body["choices"][0]["token_ids"]) == n
            assert body["pdd"]["pipeline"] in {"P-MD", "P-RLD", "P-RLD-MD"}
            outputs[url].append(body["choices"][0]["token_ids"])
    first, second = (outputs[u] for u in URLS)
    assert first == second  # the same engines answer the same prompt the same way


@pytest.mark.parametrize("url", URLS)
def test_a_streamed_completion_through_each_replica(url: str) -> None:
    body = {"prompt": prompt(5, 320), "max_tokens": 40, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=auth(KEY),
                      timeout=TIMEOUT) as r:  # fmt: skip
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    tokens = [t for c in chunks for choice in c["choices"] for t in choice["token_ids"]]
    assert len(tokens) == 40
    assert chunks[-1]["pdd"]["instances"]["p"] == "p0"


@pytest.mark.parametrize("url", URLS)
def test_metrics_with_the_metrics_or_admin_key_only(url: str) -> None:
    for key in (METRICS_KEY, ADMIN_KEY):
        metrics = httpx.get(f"{url}/metrics", headers=auth(key), timeout=TIMEOUT)
        assert metrics.status_code == 200
        assert "pdd_router_decision_seconds" in metrics.text
    client = httpx.get(f"{url}/metrics", headers=auth(KEY), timeout=TIMEOUT)
    assert client.status_code == 403, client.text


@pytest.mark.parametrize("url", URLS)
def test_the_client_key_cannot_change_the_cluster(url: str) -> None:
    """The stack runs with an admin key: a client may not take an engine out."""
    removed = httpx.delete(f"{url}/v1/instances/p0", headers=auth(KEY), timeout=TIMEOUT)
    assert removed.status_code == 403, removed.text
    listed = httpx.get(f"{url}/v1/instances", headers=auth(ADMIN_KEY), timeout=TIMEOUT)
    assert listed.status_code == 200, listed.text
    assert {i["instance_id"] for i in listed.json()} >= {"p0", "rld0", "md0"}


def test_both_replicas_share_one_redis_index() -> None:
    shared = prompt(6, 480)  # 30 blocks of 16
    # a tenant's salt: its own predictions are shown (docker-compose.yml shows no shared ones)
    body = {"prompt": shared, "max_tokens": 4, "cache_salt": "compose"}
    assert complete(URLS[0], body).status_code == 200
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=5)
    try:
        assert set(client.hkeys(f"{PREFIX}:instances")) == {b"p0", b"rld0", b"md0"}
        assert poll(lambda: next(client.scan_iter(f"{PREFIX}:b:*", count=1000), None), 10)
        # replicas.share (on by default): both replicas heartbeat in one ZSET
        assert poll(lambda: client.zcard(f"{PREFIX}:replicas") == 2, 10), client.zrange(
            f"{PREFIX}:replicas", 0, -1
        )
    finally:
        client.close()

    def other_replica_predicts_a_hit() -> bool:
        r = httpx.post(f"{URLS[1]}/v1/route", json={"token_ids": shared, "cache_salt": "compose"},
                       headers=auth(KEY), timeout=TIMEOUT)  # fmt: skip
        assert r.status_code == 200, r.text
        return bool(max(r.json()["predicted_hit"].values()) > 0.5)

    assert poll(other_replica_predicts_a_hit, 10)

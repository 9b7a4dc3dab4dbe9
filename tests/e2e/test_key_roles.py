"""Keys by role against a running router on engine-sim processes: the client key serves
completions and changes nothing in the cluster, the admin key administers (every change
logged with its role, action and instance), the metrics key opens /metrics only, and an
instance id already registered is replaced only when asked."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from process_support import Stack, three_tier_stack

CLIENT, ADMIN, METRICS = "client-key", "admin-key", "scrape-key"
PROMPT = [(5 * i + 2) % 512 for i in range(64)]
ENV = {"PDD_ROUTER_SERVICE__VOCAB_SIZE": "512", "PDD_ROUTER_SERVICE__LOAD_POLL_S": "0.2",
       "PDD_ROUTER_POLICY__NAME": "pdd", "PDD_ROUTER_SERVICE__API_KEY": CLIENT,
       "PDD_ROUTER_SERVICE__ADMIN_KEY": ADMIN,
       "PDD_ROUTER_SERVICE__METRICS_KEY": METRICS}  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with three_tier_stack(tmp_path_factory.mktemp("key-roles"), ENV) as stack:
        yield stack


def call(stack: Stack, method: str, path: str, key: str, json: Any = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"}
    return httpx.request(method, f"{stack.router}{path}", json=json, headers=headers, timeout=30)


def complete(stack: Stack, key: str = CLIENT) -> httpx.Response:
    return call(stack, "POST", "/v1/completions", key, {"prompt": PROMPT, "max_tokens": 2})


def instances(stack: Stack) -> dict[str, str]:
    listed = call(stack, "GET", "/v1/instances", ADMIN)
    assert listed.status_code == 200, listed.text
    return {row["instance_id"]: row["tier"] for row in listed.json()}


def refused(response: httpx.Response, status: int = 403) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status
    message: str = error["message"]
    return message


def test_the_client_key_cannot_change_the_cluster(stack: Stack) -> None:
    message = refused(call(stack, "DELETE", "/v1/instances/p0", CLIENT))
    assert "needs the admin key" in message
    assert "client key" in message
    intruder = {"instance_id": "md0", "tier": "p", "adapter": "vllm",
                "url": stack.engines["md0"].url}  # fmt: skip
    refused(call(stack, "POST", "/v1/instances?replace=true", CLIENT, intruder))
    cleared = {"instance_id": "md0", "events": [{"type": "AllBlocksCleared"}]}
    refused(call(stack, "POST", "/v1/kv-events", CLIENT, cleared))
    arms = [{"name": "a", "policy": "pdd"}, {"name": "b", "policy": "pdd-adaptive"}]
    refused(call(stack, "POST", "/v1/experiments", CLIENT, {"name": "x", "arms": arms}))
    refused(call(stack, "GET", "/v1/instances", CLIENT))  # engine URLs are the operator's
    refused(call(stack, "GET", "/metrics", CLIENT))

    assert instances(stack) == {"p0": "p", "rld0": "rld", "md0": "md"}
    served = complete(stack)
    assert served.status_code == 200, served.text
    assert served.json()["usage"]["completion_tokens"] == 2


def test_the_admin_and_metrics_keys_open_what_their_roles_allow(stack: Stack) -> None:
    assert complete(stack, ADMIN).status_code == 200
    assert "pdd_router_decisions_total" in call(stack, "GET", "/metrics", METRICS).text
    assert call(stack, "GET", "/metrics", ADMIN).status_code == 200
    refused(complete(stack, METRICS))
    refused(call(stack, "GET", "/v1/instances", METRICS))
    assert refused(complete(stack, "wrong"), 401)


def test_an_existing_id_is_replaced_only_when_asked(stack: Stack) -> None:
    as_p = {"instance_id": "md0", "tier": "p", "datacenter": "A", "adapter": "vllm",
            "url": stack.engines["md0"].url}  # fmt: skip
    message = refused(call(stack, "POST", "/v1/instances", ADMIN, as_p), 409)
    assert "'md0' is already registered" in message
    assert "replace=true" in message
    assert instances(stack)["md0"] == "md"
    assert complete(stack).status_code == 200

    as_md = {**as_p, "tier": "md", "datacenter": "B"}
    replaced = call(stack, "POST", "/v1/instances?replace=true", ADMIN, as_md)
    assert replaced.status_code == 201, replaced.text
    assert instances(stack)["md0"] == "md"


def test_every_admin_change_is_logged_with_role_action_and_instance(stack: Stack) -> None:
    extra = {"instance_id": "md1", "tier": "md", "datacenter": "B", "adapter": "vllm",
             "url": stack.engines["md0"].url}  # fmt: skip
    assert call(stack, "POST", "/v1/instances", ADMIN, extra).status_code == 201
    assert call(stack, "DELETE", "/v1/instances/md1", ADMIN).status_code == 204
    log = (stack.folder / "router.log").read_text()
    changes = [line for line in log.splitlines() if "admin change" in line]
    plain = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in changes]
    for action in ("register", "remove"):
        assert any(
            f"action={action}" in line and "instance=md1" in line and "role=admin" in line
            for line in plain
        ), plain
    assert not any("role=client" in line for line in plain)  # refused requests change nothing

"""No cross-tenant signal from the prefix cache, against running routers: a request without
a cache salt is not told what others' prompts left in the cache (no predicted hits, by
default), and a salted request sees only its own salt's blocks, in the router's
predictions and in the engines' cached-token counts (engine-sim processes, which publish
salted block hashes as vLLM does, and ``serve --demo``'s in-process engines)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from process_support import Stack, free_port, spawn, three_tier_stack, wait_for

PROMPT = [(17 * i + 9) % 512 for i in range(320)]  # 20 blocks of 16
SALTED = [(19 * i + 4) % 512 for i in range(320)]
ENV = {"PDD_ROUTER_SERVICE__VOCAB_SIZE": "512", "PDD_ROUTER_SERVICE__LOAD_POLL_S": "0.2",
       "PDD_ROUTER_POLICY__NAME": "pdd",  # shared predictions off: the default, said here
       "PDD_ROUTER_SERVICE__SHOW_SHARED_PREDICTIONS": "false"}  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with three_tier_stack(tmp_path_factory.mktemp("tenants"), ENV) as stack:
        yield stack


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    response = httpx.post(f"{url}{path}", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response


def complete(url: str, prompt: list[int], salt: str | None = None) -> httpx.Response:
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": 2}
    if salt is not None:
        body["cache_salt"] = salt
    return post(url, "/v1/completions", body)


def route(url: str, prompt: list[int], salt: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"token_ids": prompt}
    if salt is not None:
        body["cache_salt"] = salt
    decision: dict[str, Any] = post(url, "/v1/route", body).json()
    return decision


def md_hit_once_indexed(url: str, prompt: list[int], salt: str) -> float:
    """The salted prompt's predicted MD hit, once MD's KV events have reached the index."""
    deadline = time.time() + 10
    hit = 0.0
    while time.time() < deadline:
        hit = float(route(url, prompt, salt)["predicted_hit"].get("md", 0.0))
        if hit > 0.5:
            break
        time.sleep(0.05)
    return hit


def test_an_unsalted_request_is_not_told_what_others_cached(stack: Stack) -> None:
    first = complete(stack.router, PROMPT)  # another client's prompt
    assert first.json()["pdd"]["pipeline"]
    decision = route(stack.router, PROMPT)
    assert decision["pipeline"] in ("P-MD", "P-RLD-MD", "P-RLD")
    for field in ("predicted_hit", "predicted_wan_bytes", "predicted_ttft_s", "reason"):
        assert field not in decision, decision
    again = complete(stack.router, PROMPT)
    assert "predicted_hit" not in again.json()["pdd"]
    assert "x-pdd-decision" not in again.headers
    assert again.headers["x-pdd-pipeline"]


def test_salted_requests_see_their_own_salt_only(stack: Stack) -> None:
    complete(stack.router, SALTED, "tenant-a")
    assert md_hit_once_indexed(stack.router, SALTED, "tenant-a") > 0.5
    assert route(stack.router, SALTED, "tenant-b")["predicted_hit"]["md"] == 0.0

    other = complete(stack.router, SALTED, "tenant-b").json()
    assert other["pdd"]["predicted_hit"]["md"] == 0.0
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    own = complete(stack.router, SALTED, "tenant-a").json()
    assert own["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16 * 16


def test_the_demo_engines_honour_the_salt(tmp_path: Any) -> None:
    port = free_port()
    log = tmp_path / "demo.log"
    proc = spawn(["serve", "--demo", "--port", str(port), "--log-level", "warning"], log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(f"{url}/readyz", [(proc, log)])
        prompt = [(23 * i + 5) % 500 for i in range(2720)]

        def cached(salt: str) -> int:
            body = {"model": "pdd-demo", "prompt": prompt, "max_tokens": 2, "cache_salt": salt}
            usage = post(url, "/v1/completions", body).json()["usage"]
            return int(usage["prompt_tokens_details"]["cached_tokens"])

        assert cached("tenant-a") == 0
        assert cached("tenant-b") == 0  # only tenant-a sent it
        assert cached("tenant-a") >= 2720 - 2 * 16
    finally:
        proc.terminate()
        proc.wait(timeout=15)

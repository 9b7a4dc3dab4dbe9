"""The router in front of two real vLLM engines on the CPU (make test-vllm).

These engines run no KV connector (test_vllm_kv_transfer.py has two that do), so P and
RLD are one engine and MD rebuilds the prompt's KV itself (from its prefix cache where
it can). What this proves: routing, streaming, the exactness of the token-ID handoff,
and that KV events from vLLM make the router's predicted hit match what vLLM counts.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from router.service.app import create_app
from router.settings import Settings
from vllm_launcher import BLOCK_SIZE, ROUTER_SERVICE, VOCAB, Endpoint, pair_instances

pytestmark = pytest.mark.vllm


def router(pair: list[Endpoint], policy_params: dict[str, Any], **service: Any) -> TestClient:
    a, b = pair
    settings = Settings(
        block_size=16,
        service={**ROUTER_SERVICE, **service},
        policy={"name": "pdd", "params": policy_params},
    )
    client = TestClient(create_app(settings))
    client.__enter__()
    for body in pair_instances(a, b):
        assert client.post("/v1/instances", json={**body, "adapter": "vllm"}).status_code == 201
    return client


@pytest.fixture
def relay_router(vllm_pair: list[Endpoint]) -> Iterator[TestClient]:
    """Every request through RLD: a WAN budget no transfer fits."""
    client = router(vllm_pair, {"wan_budget_s": 1e-9, "catch_up_below": 0.0})
    yield client
    client.__exit__(None, None, None)


@pytest.fixture
def decision_log(tmp_path: Path) -> Path:
    return tmp_path / "decisions.jsonl"


@pytest.fixture
def default_router(vllm_pair: list[Endpoint], decision_log: Path) -> Iterator[TestClient]:
    """The default policy, logging its decisions and their outcomes."""
    client = router(vllm_pair, {}, decision_log=str(decision_log))
    yield client
    client.__exit__(None, None, None)


def fresh_prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def greedy(url: str, prompt: list[int], n: int) -> list[int]:
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}  # fmt: skip
    tokens: list[int] = httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()[
        "choices"
    ][0]["token_ids"]
    return tokens


def prefix_hits(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:prefix_cache_hits":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError("vllm:prefix_cache_hits_total not exported")


def test_p_rld_md_streams_from_rld_and_hands_off_to_md_exactly(
    relay_router: TestClient, vllm_pair: list[Endpoint]
) -> None:
    prompt = fresh_prompt(700, seed=1)
    # MD already holds the prompt, as when its KV copy arrives early: its readiness
    # is then a prefix-cache hit. The client then pauses after the first chunk: the
    # stream is not read meanwhile, so the orchestrator reads RLD's next delta (and
    # looks at MD's readiness) only after MD has had seconds to get ready, instead of
    # racing RLD's whole output on a loaded 2-core machine. RLD streams the first
    # tokens; MD the rest.
    greedy(vllm_pair[1].url, prompt, 1)
    body = {"prompt": prompt, "max_tokens": 1000, "stream": True, "ignore_eos": True}
    chunks = []
    with relay_router.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["x-pdd-pipeline"] == "P-RLD-MD"
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
                if len(chunks) == 1:
                    time.sleep(5)
    assert "error" not in chunks[-1]
    tokens = [t for c in chunks for choice in c["choices"] for t in choice["token_ids"]]
    served = chunks[-1]["pdd"]
    assert served["pipeline"] == "P-RLD-MD", served["pipeline_change"]
    assert served["handoff"] == "one-shot"
    assert served["instances"] == {"p": "p0", "rld": "rld0", "md": "md0"}
    assert 0 < served["eager_tokens"] < 1000  # the first tokens came from RLD, the rest from MD
    single = greedy(vllm_pair[1].url, prompt, 1000)
    pairs = enumerate(zip(tokens, single, strict=False))
    first_diff = next((i for i, (a, b) in pairs if a != b), None)
    assert tokens == single, f"differs at {first_diff}, handoff after {served['eager_tokens']}"


def test_kv_events_make_the_predicted_hit_match_what_vllm_counts(
    default_router: TestClient, vllm_pair: list[Endpoint], decision_log: Path
) -> None:
    md_url = vllm_pair[1].url
    first = fresh_prompt(8 * BLOCK_SIZE, seed=2)
    r = default_router.post("/v1/completions", json={"prompt": first, "max_tokens": 4})
    assert r.status_code == 200
    assert r.json()["pdd"]["instances"]["md"] == "md0"
    second = first[: 6 * BLOCK_SIZE] + fresh_prompt(300, seed=3)
    deadline = time.monotonic() + 30
    predicted = 0.0
    while time.monotonic() < deadline:
        route = default_router.post("/v1/route", json={"token_ids": second}).json()
        predicted = route["predicted_hit"]["md"] * len(second)
        if predicted >= 6 * BLOCK_SIZE:
            break
        time.sleep(0.2)
    before = prefix_hits(md_url)
    r = default_router.post("/v1/completions", json={"prompt": second, "max_tokens": 4})
    assert r.status_code == 200
    assert r.json()["pdd"]["instances"]["md"] == "md0"
    counted = prefix_hits(md_url) - before
    assert counted == 6 * BLOCK_SIZE
    assert abs(predicted - counted) <= BLOCK_SIZE  # within one block
    # the decision log joins the request with its realized hit, which is what vLLM
    # counted
    request_id = r.json()["id"]
    deadline = time.monotonic() + 30
    outcome: dict[str, Any] | None = None
    while outcome is None and time.monotonic() < deadline:
        lines = [json.loads(line) for line in decision_log.read_text().splitlines()]
        outcome = next((x for x in lines if x["kind"] == "outcome" and x["id"] == request_id), None)
        time.sleep(0.1)
    assert outcome is not None, "no outcome line for the request"
    assert outcome["source"] == "usage"  # the engines run with --enable-prompt-tokens-details
    assert outcome["realized_hit"]["md"] * len(second) == pytest.approx(counted)
    # and the same hit read from vLLM's KV events (what engines without usage details give)
    assert outcome["events_hit"]["md"] * len(second) == pytest.approx(counted)

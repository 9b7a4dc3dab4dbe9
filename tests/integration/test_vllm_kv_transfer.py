"""KV computed by P really moves to MD: two CPU vLLM engines with a KV connector (make
test-vllm).

vLLM's ``ExampleConnector`` works on the CPU (docs/vllm-observed.md, section 10): each
engine writes the KV of the prompts it computes to a shared folder and loads it from
there for a prompt whose block-aligned prefix another engine already computed. It is a
debug connector (files, on every request), but the KV it loads is real: an engine
answering from it produces what it would have computed itself. So a P-MD request
through the router exercises the transfer path for real: P prefills, MD decodes from
P's KV instead of computing the prompt again.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from router.service.app import create_app
from router.settings import Settings
from vllm_launcher import (
    ROUTER_SERVICE,
    VOCAB,
    Endpoint,
    external_tokens,
    random_model,
    vllm_python,
    vllm_servers,
)

pytestmark = pytest.mark.vllm

CONNECTOR_BLOCK = 128  # ExampleConnector matches prompts aligned down to vLLM's block


@pytest.fixture(scope="module")
def connected_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Endpoint]]:
    """P and MD engines sharing one KV store."""
    python = vllm_python()
    model = random_model(python, tmp_path_factory.mktemp("vllm-kv-transfer"))
    store = tmp_path_factory.mktemp("kvstore")
    connector = {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                 "kv_connector_extra_config": {"shared_storage_path": str(store)}}  # fmt: skip
    extra = ["--kv-transfer-config", json.dumps(connector)]
    with vllm_servers(python, model, 2, extra_args=extra) as endpoints:
        yield endpoints


@pytest.fixture
def p_md_router(connected_pair: list[Endpoint]) -> Iterator[TestClient]:
    """P on the first engine, MD on the second, every request P-MD (no RLD)."""
    p, md = connected_pair
    settings = Settings(
        block_size=16,
        service=ROUTER_SERVICE,
        policy={"name": "pdd", "params": {"wan_budget_s": 1e6}},
    )  # fmt: skip
    with TestClient(create_app(settings)) as client:
        for body in (
            {"instance_id": "p0", "tier": "p", "datacenter": "A", "url": p.url},
            {"instance_id": "md0", "tier": "md", "datacenter": "B", "url": md.url},
        ):
            response = client.post("/v1/instances", json={**body, "adapter": "vllm"})
            assert response.status_code == 201, response.text
        yield client


def test_md_decodes_from_the_kv_p_computed(
    p_md_router: TestClient, connected_pair: list[Endpoint]
) -> None:
    p, md = connected_pair
    rng = random.Random(7)
    prompt = [rng.randrange(3, VOCAB) for _ in range(700)]  # never seen by either engine
    before = external_tokens(md.url)
    body = {"prompt": prompt, "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    answer = p_md_router.post("/v1/completions", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-pdd-pipeline"] == "P-MD"
    served = answer.json()["pdd"]
    assert served["instances"] == {"p": "p0", "md": "md0"}
    # MD loaded every whole block of the prompt from P's KV, rather than computing it
    assert external_tokens(md.url) - before == (700 - 1) // CONNECTOR_BLOCK * CONNECTOR_BLOCK
    # and decoding from it gives what one engine computing everything itself gives
    alone = httpx.post(
        f"{p.url}/v1/completions",
        json={**body, "return_token_ids": True},
        timeout=120,
    ).json()["choices"][0]["token_ids"]
    assert answer.json()["choices"][0]["token_ids"] == alone

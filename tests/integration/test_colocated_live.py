"""The router in front of colocated engines (`policy: colocated`): each request goes, whole,
to one engine, the one holding its prefix when another is no quicker to start it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from engine_sim.engine import SimEngine, SimEngineConfig
from router.service.app import create_app
from router.service.schemas import InstanceConfig
from router.settings import Settings

VOCAB = 512
KEY = "colocated-key"
SHARED = [3 + i % 500 for i in range(1024)]  # 1,024 tokens: 64 blocks of 16


@pytest.fixture
def router() -> Iterator[TestClient]:
    engines: dict[str, SimEngine] = {}

    def sim(config: InstanceConfig, _: httpx.AsyncClient) -> SimEngine:
        engines[config.instance_id] = SimEngine(
            config.instance_id, SimEngineConfig(vocab_size=VOCAB)
        )
        return engines[config.instance_id]

    service = {"vocab_size": VOCAB, "api_key": KEY, "show_shared_predictions": True}
    settings = Settings(service=service, policy={"name": "colocated"})
    app: FastAPI = create_app(settings, adapter_factory=sim)
    with TestClient(app, headers={"authorization": f"Bearer {KEY}"}) as client:
        for iid in ("e0", "e1"):
            body = {"instance_id": iid, "tier": "p", "datacenter": "A", "adapter": "sim"}
            client.post("/v1/instances", json=body).raise_for_status()
        yield client


def _openai(client: TestClient) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{client.base_url}/v1", api_key=KEY, http_client=client, max_retries=0
    )


def test_a_request_is_served_whole_by_one_engine(router: TestClient) -> None:
    ready = router.get("/readyz")
    assert ready.status_code == 200, ready.text  # engines alone, no MD: ready all the same
    answer = router.post("/v1/completions", json={"model": "m", "prompt": SHARED, "max_tokens": 6})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-pdd-pipeline"] == "colocated"
    served = answer.json()["pdd"]
    assert set(served["instances"]) == {"p"}
    assert answer.json()["usage"]["completion_tokens"] == 6


def test_the_second_turn_goes_where_its_prefix_is_cached(router: TestClient) -> None:
    """The first turn lands on e1 because e0 is busy; once both are idle, the second turn
    goes back to e1 for its prefix (by load alone it would go to e0, first by name)."""
    other = [3 + (i * 7) % 500 for i in range(1024)]  # another conversation, on e0
    body = {"model": "m", "prompt": other, "max_tokens": 200, "stream": True}
    with router.stream("POST", "/v1/completions", json=body) as busy:
        assert busy.headers["x-pdd-pipeline"] == "colocated"
        next(busy.iter_lines())
        first = router.post(
            "/v1/completions", json={"model": "m", "prompt": SHARED, "max_tokens": 2}
        )
        assert first.json()["pdd"]["instances"]["p"] == "e1"
    stream = _openai(router).completions.create(
        model="m", prompt=[*SHARED, *range(100, 164)], max_tokens=5, stream=True
    )
    assert len([c for c in stream if c.choices]) >= 1  # streaming through the SDK too
    again = router.post(
        "/v1/completions", json={"model": "m", "prompt": [*SHARED, 7, 7, 7], "max_tokens": 2}
    )
    assert again.json()["pdd"]["instances"]["p"] == "e1"
    assert again.json()["pdd"]["predicted_hit"]["p"] > 0.9

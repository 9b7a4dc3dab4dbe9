"""Admission control through the live service, driven by the official ``openai`` client.

A request the default policy predicts would miss the SLA is refused with 429,
``Retry-After`` and OpenAI's error shape (the client raises ``RateLimitError``), and is
counted in ``pdd_router_rejections_total`` by bottleneck; the same request is served when
the threshold allows it. One that would miss it even alone on the cluster is a 400: a
retry cannot help.
"""

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
from router.settings import ClusterSettings, Settings

VOCAB = 512
KEY = "admission-key"
PROMPT = list(range(1, 257))  # 256 tokens, nothing cached


def _sim(config: InstanceConfig, _: httpx.AsyncClient) -> SimEngine:
    return SimEngine(config.instance_id, SimEngineConfig(vocab_size=VOCAB))


def _client(params: dict[str, object]) -> Iterator[TestClient]:
    settings = Settings(service={"vocab_size": VOCAB, "api_key": KEY}, policy={"params": params})
    app: FastAPI = create_app(settings, adapter_factory=_sim)
    with TestClient(app, headers={"authorization": f"Bearer {KEY}"}) as client:
        for iid, tier, dc in (("p0", "p", "A"), ("rld0", "rld", "A"), ("md0", "md", "B")):
            body = {"instance_id": iid, "tier": tier, "datacenter": dc, "adapter": "sim"}
            client.post("/v1/instances", json=body).raise_for_status()
        yield client


# PROMPT's own prefill and first decode step on the default cluster settings: what it
# takes with nothing queued ahead of it
ALONE_S = len(PROMPT) / ClusterSettings().prefill_tokens_per_s + ClusterSettings().decode_step_s


@pytest.fixture
def strict() -> Iterator[TestClient]:
    """The default policy with a TTFT threshold the request alone meets, but not with the
    copy of its KV to a decode instance (on either path) added."""
    yield from _client({"admit_ttft_s": ALONE_S * 1.001})


@pytest.fixture
def impossible() -> Iterator[TestClient]:
    """The default policy with a TTFT threshold no prefill can meet."""
    yield from _client({"admit_ttft_s": 1e-9})


@pytest.fixture
def default() -> Iterator[TestClient]:
    yield from _client({})


def _openai(client: TestClient) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{client.base_url}/v1", api_key=KEY, http_client=client, max_retries=0
    )


def _rejections(client: TestClient) -> dict[str, float]:
    out = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("pdd_router_rejections_total{"):
            label, value = line.split("} ")
            out[label.split('"')[1]] = float(value)
    return out


def _outcomes(client: TestClient) -> dict[tuple[str, str], float]:
    """``pdd_router_requests_total`` by (pipeline, outcome)."""
    out = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("pdd_router_requests_total{"):
            labels, value = line.split("} ")
            fields = dict(part.split("=") for part in labels.split("{")[1].split(","))
            out[fields["pipeline"].strip('"'), fields["outcome"].strip('"')] = float(value)
    return out


def test_an_over_capacity_request_is_a_429_with_retry_after(strict: TestClient) -> None:
    with pytest.raises(openai.RateLimitError) as refused:
        _openai(strict).completions.create(model="m", prompt=PROMPT, max_tokens=4)
    response = refused.value.response
    assert response.status_code == 429
    assert int(response.headers["retry-after"]) >= 1
    error = response.json()["error"]
    assert error["type"] == "rate_limit_exceeded"
    assert error["code"] == "overloaded"
    assert "over capacity" in error["message"]
    assert set(_rejections(strict)) <= {"wan", "rld"}  # the copy, not the prefill
    assert sum(_rejections(strict).values()) == 1.0
    assert _outcomes(strict) == {("none", "rejected"): 1.0}  # refused before any pipeline


def test_a_request_that_misses_the_limit_on_its_own_is_a_400_not_a_retry(
    impossible: TestClient,
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        _openai(impossible).completions.create(model="m", prompt=PROMPT, max_tokens=4)
    response = refused.value.response
    assert response.status_code == 400
    assert "retry-after" not in response.headers
    assert response.headers["x-pdd-bottleneck"] == "prefill"  # replay live counts it refused
    error = response.json()["error"]
    assert error["code"] == "first_token_limit"
    assert f"first token takes {ALONE_S:.2f}s" in error["message"]
    assert "admit_ttft_s" in error["message"]
    assert _rejections(impossible) == {"prefill": 1.0}
    assert _outcomes(impossible) == {("none", "rejected"): 1.0}


def test_within_capacity_the_same_request_is_served(default: TestClient) -> None:
    completion = _openai(default).completions.create(model="m", prompt=PROMPT, max_tokens=4)
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 4
    assert _rejections(default) == {}

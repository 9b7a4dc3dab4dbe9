"""A model tokenized by its engine (``tokenize_with_engine``) whose engine cannot be
reached: chat and completions answer 502 naming the engine that tokenizes, in OpenAI's
error shape, as ``/tokenize`` does (it was a 500)."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_support import Engines

from router.service.app import create_app
from router.settings import Settings


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed once the socket is


@pytest.fixture(scope="module")
def client() -> Any:
    settings = Settings(
        service={"allow_unauthenticated_admin": True, "vocab_size": 512},
        models=[{"name": "m", "tokenizer": {"tokenize_with_engine": True}}],
    )
    url = f"http://127.0.0.1:{closed_port()}"  # nothing answers there
    with TestClient(create_app(settings, adapter_factory=Engines())) as client:
        for iid, tier, dc in (("p0", "p", "A"), ("md0", "md", "B")):
            body = {"instance_id": iid, "tier": tier, "datacenter": dc, "adapter": "vllm",
                    "url": url, "model": "m"}  # fmt: skip
            assert client.post("/v1/instances", json=body).status_code == 201
        yield client


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        ),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
        ("/tokenize", {"prompt": "hi"}),
    ],
)
def test_an_unreachable_tokenizing_engine_is_a_502_naming_it(
    client: TestClient, path: str, body: dict[str, Any]
) -> None:
    answer = client.post(path, json={"model": "m", **body})
    assert answer.status_code == 502, answer.text
    error = answer.json()["error"]
    assert error["type"] == "engine_error"
    assert error["message"].startswith("the engine that tokenizes for this model failed")

"""A request that needs what its model's engines do not offer (structured output for
``response_format`` or an enforced ``tool_choice``) is refused with 400 naming the
field, not served without it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_support import Engines

from router.service.app import create_app
from router.settings import Settings

MODEL = "plain"
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
ASK = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    """Simulated engines without a tokenizer: no structured output, log probabilities yes."""
    settings = Settings(
        service={"vocab_size": 512, "load_poll_s": 0.05, "allow_unauthenticated_admin": True},
        models=[{"name": MODEL, "tokenizer": {"builtin": True}}],
    )
    with TestClient(create_app(settings, adapter_factory=Engines())) as c:
        for iid, tier, dc in (("p0", "p", "A"), ("rld0", "rld", "A"), ("md0", "md", "B")):
            body = {"instance_id": iid, "tier": tier, "datacenter": dc, "adapter": "sim",
                    "model": MODEL}  # fmt: skip
            assert c.post("/v1/instances", json=body).status_code == 201
        yield c


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"response_format": {"type": "json_object"}}, "response_format"),
     ({"tools": [TOOL], "tool_choice": "required"}, "tool_choice"),
     ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}},
      "tool_choice")],
)  # fmt: skip
def test_structured_output_on_engines_without_it_is_refused_by_name(
    client: TestClient, fields: dict[str, Any], param: str
) -> None:
    body = {"model": MODEL, "messages": ASK, "max_tokens": 4, **fields}
    answer = client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param
    assert "structured" in error["message"]


def test_the_same_engines_serve_logprobs_and_auto_tools(client: TestClient) -> None:
    body = {"model": MODEL, "messages": ASK, "max_tokens": 4, "logprobs": True,
            "tools": [TOOL]}  # fmt: skip
    answer = client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert len(choice["logprobs"]["content"]) == answer.json()["usage"]["completion_tokens"]

"""Fields a client sends beyond the router's schema, against a running router on engine-sim
processes: sampling fields reach the engine, fields that steer an engine or the router's
handoffs (``kv_transfer_params``, ``priority``, ``logits_processors``) are refused with a 400
naming them, and the engine never sees such a request."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from process_support import Stack, three_tier_stack

PROMPT = [(13 * i + 1) % 512 for i in range(96)]
ENV = {"PDD_ROUTER_SERVICE__VOCAB_SIZE": "512", "PDD_ROUTER_SERVICE__LOAD_POLL_S": "0.2",
       "PDD_ROUTER_POLICY__NAME": "pdd"}  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with three_tier_stack(tmp_path_factory.mktemp("engine-fields"), ENV) as stack:
        yield stack


def queried_tokens(stack: Stack) -> float:
    """Prompt tokens every engine was asked to look up in its cache (one count per request)."""
    total = 0.0
    for engine in stack.engines.values():
        text = httpx.get(f"{engine.url}/metrics", timeout=5).text
        found = re.search(r"^vllm:prefix_cache_queries_total\{[^}]*\} ([0-9.e+-]+)$", text, re.M)
        assert found is not None, text[:300]
        total += float(found.group(1))
    return total


def complete(stack: Stack, path: str = "/v1/completions", **fields: object) -> httpx.Response:
    body: dict[str, Any] = {"max_tokens": 2, **fields}
    if path == "/v1/completions":
        body.setdefault("prompt", PROMPT)
    return httpx.post(f"{stack.router}{path}", json=body, timeout=30)


HOSTILE = [
    ("kv_transfer_params", {"do_remote_prefill": True, "remote_host": "203.0.113.7",
                            "remote_port": 5600, "remote_engine_id": "evil"}),
    ("priority", -100),
    ("logits_processors", ["evil.module:Processor"]),
    ("vllm_xargs", {"x": 1}),
    ("request_id", "someone-elses-request"),
]  # fmt: skip


@pytest.mark.parametrize(("field", "value"), HOSTILE, ids=[f for f, _ in HOSTILE])
def test_router_owned_fields_are_refused_naming_them_and_never_reach_an_engine(
    stack: Stack, field: str, value: object
) -> None:
    before = queried_tokens(stack)
    hostile: dict[str, Any] = {field: value}
    refused = complete(stack, **hostile)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == field
    assert error["message"].startswith(f"{field}: {field} may not be set by a client")
    assert queried_tokens(stack) == before  # no engine was asked anything


def test_chat_requests_refuse_them_too(stack: Stack) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "priority": -100}
    refused = httpx.post(f"{stack.router}/v1/chat/completions", json=body, timeout=30)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "priority"


def test_sampling_fields_are_served_and_an_unknown_field_is_refused_by_name(
    stack: Stack,
) -> None:
    served = complete(stack, top_p=0.9, seed=7, top_k=5, min_tokens=1, return_token_ids=True)
    assert served.status_code == 200, served.text
    assert served.json()["usage"]["completion_tokens"] == 2
    # a field the router neither honours nor passes on is not dropped without a word
    refused = complete(stack, top_p=0.9, metadata={"a": "b"})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "metadata"
    assert "metadata is not a field this router honours or passes on" in error["message"]

"""Every generation request is counted by outcome, the ones refused before a decision
too: a running ``pdd-router serve --demo`` (API and metrics keys set, a small body
limit) is sent one request of each kind it refuses, and ``/metrics`` counts each under
its outcome with the pipeline ``none``, its model as the registry names it or
``unknown``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from process_support import free_port, spawn, terminate, wait_for
from prometheus_client.parser import text_string_to_metric_families

KEY = "client-key"
METRICS_KEY = "metrics-key"
BODY_LIMIT = 64 * 1024
MODEL = "pdd-demo"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = [{"role": "user", "content": "hello"}]
BIG = 10**6  # max_tokens over the limit


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("refusals")
    log = folder / "serve.log"
    port = free_port()
    env = {
        "PDD_ROUTER_SERVICE__API_KEY": KEY,
        "PDD_ROUTER_SERVICE__METRICS_KEY": METRICS_KEY,
        "PDD_ROUTER_SERVICE__MAX_BODY_BYTES": str(BODY_LIMIT),
    }
    args = ["serve", "--demo", "--port", str(port), "--log-level", "warning",
            "--demo-tokenizer", str(folder / "tokenizer")]  # fmt: skip
    proc = spawn(args, log, env)
    try:
        wait_for(f"http://127.0.0.1:{port}/readyz", [(proc, log)], limit_s=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        terminate(proc)


def post(url: str, path: str, key: str | None = KEY, **kwargs: Any) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(url + path, headers=headers, timeout=30, **kwargs)


Series = tuple[str, str, str]


def requests_total(url: str) -> dict[Series, float]:
    """``pdd_router_requests_total`` by (model, pipeline, outcome)."""
    text = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {METRICS_KEY}"}).text
    return {
        (s.labels["model"], s.labels["pipeline"], s.labels["outcome"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "pdd_router_requests_total"
    }


def added(before: dict[Series, float], after: dict[Series, float]) -> dict[Series, float]:
    """The series that grew, by how much."""
    grown = {k: v - before.get(k, 0.0) for k, v in after.items()}
    return {k: v for k, v in grown.items() if v}


def test_each_kind_of_refusal_is_counted_under_its_outcome(demo: str) -> None:
    before = requests_total(demo)
    template = {"model": MODEL, "messages": HELLO, "chat_template": "{{ messages }}"}
    sent = [  # (status, the request) in the order they are sent
        (401, post(demo, CHAT, key=None, json={"model": MODEL, "messages": HELLO})),
        (403, post(demo, CHAT, key=METRICS_KEY, json={"model": MODEL, "messages": HELLO})),
        (404, post(demo, CHAT, json={"model": "no-such-model", "messages": HELLO})),
        (400, post(demo, CHAT, json=template)),  # request templates are off
        (400, post(demo, COMPLETIONS, json={"model": MODEL, "prompt": "hi", "max_tokens": BIG})),
        (400, post(demo, COMPLETIONS, content=b'{"prompt": ')),
        (422, post(demo, CHAT, json={"model": MODEL})),
        (413, post(demo, COMPLETIONS, json={"model": MODEL, "prompt": "x" * BODY_LIMIT})),
    ]
    assert [r.status_code for _, r in sent] == [status for status, _ in sent], [
        r.text for _, r in sent
    ]
    served = post(demo, CHAT, json={"model": MODEL, "messages": HELLO, "max_tokens": 3})
    assert served.status_code == 200, served.text

    counts = added(before, requests_total(demo))
    refused = {k: v for k, v in counts.items() if k[1] == "none"}
    assert refused == {
        ("unknown", "none", "unauthorized"): 1,
        ("unknown", "none", "forbidden"): 1,
        ("unknown", "none", "model_not_found"): 1,
        (MODEL, "none", "invalid_request"): 2,  # a refused template, max_tokens over the limit
        ("unknown", "none", "invalid_request"): 1,  # malformed JSON
        ("unknown", "none", "unprocessable"): 1,
        ("unknown", "none", "too_large"): 1,
    }
    # the served request is counted once, on the pipeline it was decided on
    served_counts = {k: v for k, v in counts.items() if k[1] != "none"}
    assert sum(served_counts.values()) == 1
    ((model, pipeline, _),) = served_counts
    assert model == MODEL
    assert pipeline == served.headers["x-pdd-pipeline"]


def test_routes_other_than_generation_are_not_counted(demo: str) -> None:
    """A refused /tokenize or /v1/route is no generation request: it adds no series."""
    before = requests_total(demo)
    assert (
        post(demo, "/tokenize", json={"model": "no-such-model", "prompt": "hi"}).status_code == 404
    )
    assert post(demo, "/v1/route", json={"token_ids": []}).status_code in (400, 422)
    assert requests_total(demo) == before

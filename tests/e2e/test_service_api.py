"""The HTTP API driven as a client would, against in-process simulated engines."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_support import (
    PROMPT,
    TOPOLOGY,
    VOCAB,
    Engines,
    make_client,
    reference,
    register,
    sse_events,
)

from router.service.app import create_app
from router.settings import Settings


@pytest.fixture
def client() -> Iterator[TestClient]:
    with make_client(Engines()) as c:
        register(c, *TOPOLOGY)
        yield c


def test_readyz_waits_for_every_tier() -> None:
    with make_client(Engines()) as c:
        assert c.get("/readyz").status_code == 503
        register(c, ("p0", "p", "A"))
        assert c.get("/readyz").json()["tiers"]["md"] is False
        register(c, ("md0", "md", "B"))
        ready = c.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["ready"] is True
        assert c.get("/healthz").json() == {"status": "ok"}
        assert c.get("/version").status_code == 200


def test_route_returns_the_decision(client: TestClient) -> None:
    decision = client.post("/v1/route", json={"token_ids": PROMPT, "max_tokens": 64}).json()
    assert decision["pipeline"] == "P-MD"  # 640 tokens: a tiny WAN transfer
    assert decision["p_instance"] == "p0"
    assert decision["md_instance"] == "md0"
    assert decision["predicted_wan_bytes"] == pytest.approx(640 * 70_000)
    by_blocks = client.post("/v1/route", json={"hash_ids": [1, 2, 3], "block_size": 512}).json()
    assert by_blocks["pipeline"] == "P-MD"


def test_p_md_completion_equals_a_single_instance(client: TestClient) -> None:
    body = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 24}).json()
    assert body["choices"][0]["token_ids"] == reference(PROMPT, 24)
    assert body["usage"]["completion_tokens"] == 24
    assert body["pdd"]["pipeline"] == "P-MD"
    assert body["pdd"]["instances"] == {"p": "p0", "md": "md0"}


@pytest.mark.parametrize("mode", ["one-shot", "catch-up"])
def test_p_rld_md_streams_from_rld_and_hands_off_exactly(mode: str) -> None:
    # MD needs ~0.13 s to hold the prompt's KV while RLD decodes a token every 2 ms
    engines = Engines(
        md={"prefill_s_per_token": 0.0002, "decode_s_per_token": 0.001},
        rld={"decode_s_per_token": 0.002},
    )
    params = {"wan_budget_s": 1e-6, "chunk_tokens": 8}
    params["catch_up_below" if mode == "catch-up" else "rld_saturation"] = 1.0
    if mode == "one-shot":
        params["catch_up_below"] = 0.0
    with make_client(engines, policy=params) as c:
        register(c, *TOPOLOGY)
        events = sse_events(c, {"prompt": PROMPT, "max_tokens": 200})
    tokens = [t for e in events for c_ in e["choices"] for t in c_["token_ids"]]
    assert tokens == reference(PROMPT, 200)
    served = events[-1]["pdd"]
    assert served["decided_pipeline"] == "P-RLD-MD"
    assert served["pipeline"] == "P-RLD-MD"
    assert served["handoff"] == mode
    assert 0 < served["eager_tokens"] < 200
    assert served["instances"] == {"p": "p0", "rld": "rld0", "md": "md0"}


def test_odd_traffic_ends_on_rld(client: TestClient) -> None:
    with make_client(Engines(), policy={"odd_min_input": 512, "odd_max_output": 32}) as c:
        register(c, *TOPOLOGY)
        body = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 16}).json()
    assert body["pdd"]["pipeline"] == "P-RLD"
    assert body["choices"][0]["token_ids"] == reference(PROMPT, 16)


def test_kv_events_from_engines_steer_later_decisions(client: TestClient) -> None:
    import time

    first = client.post("/v1/route", json={"token_ids": PROMPT}).json()
    assert first["predicted_hit"]["md"] == 0.0
    client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4})
    deadline = time.time() + 5
    while time.time() < deadline:
        again = client.post("/v1/route", json={"token_ids": PROMPT}).json()
        if again["predicted_hit"]["md"] > 0:
            break
        time.sleep(0.02)
    # all 40 full blocks held; the engine serves 624 of the 640 tokens (never the last)
    assert again["predicted_hit"]["md"] == pytest.approx(624 / 640)
    md = next(i for i in client.get("/v1/instances").json() if i["instance_id"] == "md0")
    assert md["indexed_blocks"] >= 40


def test_posted_kv_events_in_map_and_array_form(client: TestClient) -> None:
    tokens = PROMPT[:32]
    events = [
        {"type": "BlockStored", "block_hashes": [11], "parent_block_hash": None,
         "token_ids": tokens[:16], "block_size": 16},
        ["BlockStored", [12], 11, tokens[16:32], 16],
    ]  # fmt: skip
    r = client.post("/v1/kv-events", json={"instance_id": "md0", "events": events})
    assert r.status_code == 202
    route = client.post("/v1/route", json={"token_ids": tokens}).json()
    assert route["predicted_hit"]["md"] == pytest.approx(16 / 32)  # the engine: never the last
    r = client.post("/v1/kv-events", json={"instance_id": "nope", "events": []})
    assert r.status_code == 404


def test_failover_to_another_instance_then_503() -> None:
    engines = Engines()
    with make_client(engines) as c:
        register(c, *TOPOLOGY, ("p1", "p", "A"))
        engines.by_id["p0"].faults.refuse = True
        engines.by_id["p1"].faults.refuse = False
        ok = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4})
        assert ok.status_code == 200
        assert ok.json()["pdd"]["instances"]["p"] == "p1"
        engines.by_id["p1"].faults.refuse = True
        down = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4})
        assert down.status_code == 503
        assert down.headers["retry-after"] == "1"
        assert down.json()["error"]["type"] == "service_unavailable"


def test_a_stream_that_breaks_ends_with_an_error_event() -> None:
    engines = Engines()
    with make_client(engines) as c:
        register(c, *TOPOLOGY)
        engines.by_id["md0"].faults.fail_after_tokens = 5
        with c.stream("POST", "/v1/completions",
                      json={"prompt": PROMPT, "max_tokens": 50, "stream": True}) as r:  # fmt: skip
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2][6:])
    assert "engine failed mid-stream" in error["error"]["message"]


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"prompt": "hello", "max_tokens": 4}, 400, "model"),  # no tokenizer configured
        ({"prompt": [1, 2], "max_tokens": "many"}, 422, "max_tokens"),
        ({"prompt": [1, VOCAB], "max_tokens": 4}, 400, "prompt"),
        ({"prompt": [1] * 5000, "max_tokens": 4}, 400, "prompt"),
    ],
)
def test_bad_requests_name_the_field(body: dict[str, Any], status: int, field: str) -> None:
    with make_client(Engines(), max_prompt_tokens=4096) as c:
        register(c, *TOPOLOGY)
        r = c.post("/v1/completions", json=body)
    assert r.status_code == status
    assert r.json()["error"]["param"] == field


def test_unknown_instance_and_oversized_body() -> None:
    with make_client(Engines(), max_body_bytes=10_000) as c:
        assert c.get("/v1/instances/ghost").status_code == 404
        assert c.delete("/v1/instances/ghost").status_code == 404
        r = c.post("/v1/completions", json={"prompt": list(range(5000))})
        assert r.status_code == 413
        assert r.json()["error"]["code"] == 413


def test_admin_endpoints_require_the_api_key() -> None:
    with make_client(Engines(), api_key="s3cret") as c:
        body = {"instance_id": "p0", "tier": "p", "adapter": "sim"}
        assert c.post("/v1/instances", json=body).status_code == 401
        assert c.get("/v1/instances").status_code == 401
        register(c, ("p0", "p", "A"), key="s3cret")
        listed = c.get("/v1/instances", headers={"authorization": "Bearer s3cret"})
        assert [i["instance_id"] for i in listed.json()] == ["p0"]


def test_metrics_count_decisions_by_pipeline(client: TestClient) -> None:
    client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4})
    text = client.get("/metrics").text
    assert 'pdd_router_decisions_total{arm="default",handoff="none",pipeline="P-MD"} 1.0' in text
    assert "pdd_router_decision_seconds_count 1.0" in text


def test_a_removed_instance_leaves_no_series(client: TestClient) -> None:
    """Instances come and go under their own names: a removed one's series go with it."""
    client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4})
    assert 'instance="md0"' in client.get("/metrics").text  # upstream calls, KV events
    assert client.delete("/v1/instances/md0").status_code == 204
    text = client.get("/metrics").text
    assert 'instance="md0"' not in text
    assert 'pdd_router_upstream_requests_total{instance="p0"}' in text


def test_a_span_per_decision_and_per_upstream_call() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = Settings(service={"vocab_size": VOCAB, "allow_unauthenticated_admin": True})
    app = create_app(settings, adapter_factory=Engines(), tracer_provider=provider)
    with TestClient(app) as c:
        register(c, *TOPOLOGY)
        assert (
            c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8}).status_code == 200
        )
    spans = {(s.name, (s.attributes or {}).get("pdd.instance")): s.attributes or {}
             for s in exporter.get_finished_spans()}  # fmt: skip
    assert spans[("pdd.decide", None)]["pdd.pipeline"] == "P-MD"
    assert spans[("pdd.prefill", "p0")]["pdd.prompt_tokens"] == len(PROMPT)
    assert spans[("pdd.stream", "md0")]["pdd.tokens"] == 8


def test_a_busy_prefill_instance_sends_concurrent_requests_elsewhere() -> None:
    """The router counts the prompt tokens it has sent each P instance to prefill: with
    p0 busy, requests whose prefix p0 holds go to p1 once p0's queue outweighs the hit."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    engines = Engines(p={"prefill_s_per_token": 0.001})  # 640 uncached tokens: 0.64 s
    with make_client(engines) as client:
        register(client, ("p0", "p", "A"), ("p1", "p", "A"), *TOPOLOGY[1:])
        warm = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
        assert warm.json()["pdd"]["instances"]["p"] == "p0"  # ties go to the first id
        deadline = time.time() + 5
        while (
            client.post("/v1/route", json={"token_ids": PROMPT}).json()["predicted_hit"]["p"] == 0.0
            and time.time() < deadline
        ):
            time.sleep(0.02)
        # half of PROMPT is held on p0: 320 tokens to compute there, 640 on p1
        prompts = [PROMPT[:320] + [(7 * i + k) % VOCAB for k in range(320)] for i in range(4)]
        alone = client.post("/v1/route", json={"token_ids": prompts[0]}).json()
        assert alone["p_instance"] == "p0"  # idle, p0's hit decides

        def send(k: int) -> str:
            # 50 ms apart, well within one prefill (0.32 s on p0): each decision comes
            # after the previous request's prefill is counted, not in the same instant
            time.sleep(0.05 * k)
            body = {"prompt": prompts[k], "max_tokens": 2}
            response = client.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            chosen: str = response.json()["pdd"]["instances"]["p"]
            return chosen

        with ThreadPoolExecutor(max_workers=4) as pool:
            chosen = list(pool.map(send, range(len(prompts))))
    assert set(chosen) == {"p0", "p1"}, chosen  # without the count, all four went to p0


def test_tenants_with_different_cache_salts_never_share_a_predicted_hit() -> None:
    """cache_salt goes into the block hashes (the first block, so the whole chain): the
    router recorded tenant a's prompt (approximate mode), and only tenant a's next request
    for the same prompt is predicted to hit, not tenant b's."""
    with make_client(Engines(), approximate_index=True) as c:
        register(c, *TOPOLOGY)

        def predicted(salt: str | None) -> float:
            body: dict[str, Any] = {"prompt": PROMPT, "max_tokens": 2}
            if salt is not None:
                body["cache_salt"] = salt
            response = c.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            hit: float = response.json()["pdd"]["predicted_hit"]["md"]
            return hit

        assert predicted("tenant-a") == 0.0  # nothing cached yet
        assert predicted("tenant-a") == pytest.approx(624 / 640)  # its own prefix
        assert predicted("tenant-b") == 0.0  # the same tokens, another tenant
        assert predicted("tenant-b") == pytest.approx(624 / 640)  # b's own, now recorded
        assert predicted("tenant-c") == 0.0


def test_requests_go_only_to_the_instances_of_their_model() -> None:
    """Two models behind one router: each request is decided among its model's instances,
    /v1/models lists both, and a model nobody serves is a 404 in OpenAI's shape."""
    from router.service.app import create_app
    from router.settings import Settings

    settings = Settings(
        service={"vocab_size": VOCAB, "load_poll_s": 0.05, "allow_unauthenticated_admin": True},
        models=[{"name": name, "tokenizer": {"builtin": True}} for name in ("small", "large")],
    )
    with TestClient(create_app(settings, adapter_factory=Engines())) as c:
        for model in ("small", "large"):
            for iid, tier, dc in (("p", "p", "A"), ("md", "md", "B")):
                body = {"instance_id": f"{iid}-{model}", "tier": tier, "datacenter": dc,
                        "adapter": "sim", "model": model}  # fmt: skip
                assert c.post("/v1/instances", json=body).status_code == 201
        listed = c.get("/v1/models").json()
        assert [m["id"] for m in listed["data"]] == ["large", "small"]
        for model in ("small", "large", "small"):
            request = {"model": model, "prompt": PROMPT, "max_tokens": 2}
            served = c.post("/v1/completions", json=request).json()["pdd"]["instances"]
            assert served == {"p": f"p-{model}", "md": f"md-{model}"}
            decision = c.post("/v1/route", json={"token_ids": PROMPT, "model": model}).json()
            chosen = (decision["p_instance"], decision["md_instance"])
            assert chosen == (f"p-{model}", f"md-{model}")
        missing = c.post("/v1/completions", json={"model": "huge", "prompt": PROMPT})
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "model_not_found"

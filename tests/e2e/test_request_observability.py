"""What an operator sees of the requests the router serves: per-request Prometheus metrics
(latency histograms, token counters, outcomes, in-flight gauges) and one trace per
request with a span per stage, against in-process simulated engines."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families
from service_support import PROMPT, TOPOLOGY, VOCAB, Engines, make_client, register, sse_events

from router.service.app import create_app
from router.settings import Settings

P_MD = {"model": "pdd-router", "pipeline": "P-MD"}


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the sample ``name`` whose labels include ``labels`` (None: no such
    series)."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and labels.items() <= s.labels.items():
                return float(s.value)
    return None


@pytest.fixture
def client() -> Iterator[TestClient]:
    with make_client(Engines()) as c:
        register(c, *TOPOLOGY)
        yield c


def test_served_requests_are_counted_per_model_and_pipeline(client: TestClient) -> None:
    whole = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8}).json()
    events = sse_events(client, {"prompt": PROMPT, "max_tokens": 6,
                                 "stream_options": {"include_usage": True}})  # fmt: skip
    usages = [whole["usage"], events[-1]["usage"]]
    text = client.get("/metrics").text

    assert sample(text, "pdd_router_ttft_seconds_count", **P_MD, arm="default") == 2
    assert sample(text, "pdd_router_e2e_request_latency_seconds_count", **P_MD) == 2
    assert sample(text, "pdd_router_prompt_tokens_total", **P_MD) == 2 * len(PROMPT)
    assert sample(text, "pdd_router_generation_tokens_total", **P_MD) == 8 + 6
    # every token but each request's first comes after a gap
    assert sample(text, "pdd_router_inter_token_latency_seconds_count", **P_MD) == 7 + 5
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert cached > 0  # the second prompt found the first one's blocks
    assert sample(text, "pdd_router_prompt_cached_tokens_total", **P_MD) == cached
    assert sample(text, "pdd_router_requests_total", **P_MD, outcome="length") == 2
    assert sample(text, "pdd_router_requests_in_flight", model="pdd-router") == 0
    assert sample(text, "pdd_router_requests_queued", model="pdd-router") == 0
    # only what MD lacks crosses the WAN, at the default 70 kB of KV per token
    wan = (2 * len(PROMPT) - cached) * 70_000
    assert sample(text, "pdd_router_wan_bytes_total", **P_MD) == pytest.approx(wan)


def test_a_model_name_the_client_made_up_is_no_label(client: TestClient) -> None:
    """While no setting and no instance names a model, any name is served as the default
    model: it must not become a series (a client could create them without end)."""
    body = {"prompt": PROMPT, "max_tokens": 2, "model": "made-up-by-the-client"}
    assert client.post("/v1/completions", json=body).status_code == 200
    text = client.get("/metrics").text
    assert "made-up-by-the-client" not in text
    assert sample(text, "pdd_router_requests_total", **P_MD, outcome="length") == 1


def test_failed_requests_are_counted_by_error_kind() -> None:
    with make_client(Engines()) as c:
        refused = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4})
        assert refused.status_code == 503  # no instance yet
        register(c, *TOPOLOGY)
        served = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
        assert served.status_code == 200
        text = c.get("/metrics").text
    none = {"model": "pdd-router", "pipeline": "none"}
    assert sample(text, "pdd_router_requests_total", **none, outcome="unavailable") == 1
    assert sample(text, "pdd_router_e2e_request_latency_seconds_count", **none) is None
    assert sample(text, "pdd_router_requests_total", **P_MD, outcome="length") == 1
    assert sample(text, "pdd_router_requests_in_flight", model="pdd-router") == 0
    assert sample(text, "pdd_router_requests_queued", model="pdd-router") == 0


def test_a_stream_broken_by_its_engine_counts_as_an_engine_error() -> None:
    engines = Engines()
    with make_client(engines) as c:
        register(c, *TOPOLOGY)
        engines.by_id["md0"].faults.fail_after_tokens = 3
        events = sse_events(c, {"prompt": PROMPT, "max_tokens": 10})
        assert "error" in events[-1]
        text = c.get("/metrics").text
    assert sample(text, "pdd_router_requests_total", **P_MD, outcome="engine_error") == 1
    assert sample(text, "pdd_router_generation_tokens_total", **P_MD) == 3
    assert sample(text, "pdd_router_e2e_request_latency_seconds_count", **P_MD) == 1
    assert sample(text, "pdd_router_requests_in_flight", model="pdd-router") == 0


def traced_request(policy: dict[str, Any], engines: Engines, max_tokens: int) -> list[ReadableSpan]:
    """The spans of one streamed completion on a service traced into memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = Settings(
        service={"vocab_size": VOCAB, "allow_unauthenticated_admin": True,
                 "show_shared_predictions": True},
        policy={"name": "pdd", "params": policy},
    )  # fmt: skip
    with TestClient(create_app(settings, adapter_factory=engines, tracer_provider=provider)) as c:
        register(c, *TOPOLOGY)
        exporter.clear()  # the registrations' spans
        sse_events(c, {"prompt": PROMPT, "max_tokens": max_tokens})
    return list(exporter.get_finished_spans())


def stages(spans: list[ReadableSpan]) -> list[tuple[str, object]]:
    """The stage spans as (name, instance), in the order they started."""
    ours = sorted((s for s in spans if s.name.startswith("pdd.")), key=lambda s: s.start_time or 0)
    return [(s.name, (s.attributes or {}).get("pdd.instance")) for s in ours]


def test_a_p_md_request_is_one_trace_with_a_span_per_stage() -> None:
    spans = traced_request({}, Engines(), max_tokens=8)
    assert stages(spans) == [
        ("pdd.tokenize", None), ("pdd.decide", None), ("pdd.prefill", "p0"),
        ("pdd.transfer", "md0"), ("pdd.stream", "md0"),
    ]  # fmt: skip
    assert len({s.context.trace_id for s in spans if s.context is not None}) == 1
    root = next(s for s in spans if s.parent is None)
    assert root.name.startswith("POST /v1/completions")
    parents = {s.parent.span_id if s.parent else None for s in spans if s.name.startswith("pdd.")}
    assert root.context is not None
    assert parents == {root.context.span_id}  # every stage is the HTTP request's child
    by_name = {s.name: s for s in spans}
    assert (by_name["pdd.stream"].attributes or {})["pdd.tokens"] == 8
    transfer, streamed = by_name["pdd.transfer"], by_name["pdd.stream"]
    assert transfer.end_time == streamed.start_time  # the first token ends the transfer


def test_a_handoff_shows_rld_s_stream_md_s_copy_and_the_switch() -> None:
    # MD needs ~0.13 s to hold the prompt's KV while RLD decodes a token every 2 ms
    engines = Engines(
        md={"prefill_s_per_token": 0.0002, "decode_s_per_token": 0.001},
        rld={"decode_s_per_token": 0.002},
    )
    policy = {"wan_budget_s": 1e-6, "chunk_tokens": 8, "rld_saturation": 1.0,
              "catch_up_below": 0.0}  # fmt: skip
    spans = traced_request(policy, engines, max_tokens=200)
    found = stages(spans)
    assert found[:4] == [("pdd.tokenize", None), ("pdd.decide", None), ("pdd.prefill", "p0"),
                         ("pdd.transfer", "rld0")]  # fmt: skip
    assert {("pdd.stream", "rld0"), ("pdd.transfer", "md0"), ("pdd.handoff", "md0"),
            ("pdd.stream", "md0")} <= set(found)  # fmt: skip
    assert found[-2:] == [("pdd.handoff", "md0"), ("pdd.stream", "md0")]
    streamed = [s for s in spans if s.name == "pdd.stream"]
    assert sum((s.attributes or {})["pdd.tokens"] for s in streamed) == 200  # type: ignore[misc]


def test_probes_and_scrapes_are_not_traced() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = Settings(service={"vocab_size": VOCAB})
    with TestClient(create_app(settings, adapter_factory=Engines(), tracer_provider=provider)) as c:
        for path in ("/healthz", "/readyz", "/metrics", "/v1/models"):
            c.get(path)
    assert [s.name for s in exporter.get_finished_spans()] == ["GET /v1/models"]

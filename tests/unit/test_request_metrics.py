"""One request's recorder: bounded labels, one end per request, gauges back to zero."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from engines_adapter.contract import EngineError
from policies.types import Decision, Pipeline
from router.service.errors import ApiError
from router.service.models import ResolvedModel
from router.service.request_metrics import (
    OUTCOMES,
    RequestFamilies,
    RequestMetrics,
    outcome_of,
    refusal_outcome,
)

LLAMA = ResolvedModel("llama", "llama", None)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def decision(pipeline: Pipeline) -> Decision:
    return Decision(policy="pdd", pipeline=pipeline, p_instance="p0", md_instance="md0")


def test_an_engine_s_unknown_finish_reason_counts_as_other(registry: CollectorRegistry) -> None:
    families = RequestFamilies(registry)
    for reason in ("stop", "something-an-engine-invented"):
        rec = RequestMetrics(families, LLAMA, prompt_tokens=10)
        rec.decided(decision(Pipeline.P_MD), None)
        rec.tokens(1)
        rec.finished(reason, None)
    labels = {"model": "llama", "pipeline": "P-MD"}
    assert value(registry, "pdd_router_requests_total", **labels, outcome="stop") == 1
    assert value(registry, "pdd_router_requests_total", **labels, outcome="other") == 1
    assert value(registry, "pdd_router_prompt_tokens_total", **labels) == 20


def test_a_request_ends_once_and_its_gauges_return_to_zero(registry: CollectorRegistry) -> None:
    families = RequestFamilies(registry)
    rec = RequestMetrics(families, LLAMA, prompt_tokens=4)
    assert value(registry, "pdd_router_requests_in_flight", model="llama") == 1
    assert value(registry, "pdd_router_requests_queued", model="llama") == 1
    rec.decided(decision(Pipeline.P_RLD_MD), "arm-b")
    rec.tokens(2)
    assert value(registry, "pdd_router_requests_queued", model="llama") == 0
    rec.tokens(3)
    rec.failed(EngineError("md0", "broke"))
    rec.close()  # the endpoint's cleanup after the failure: nothing more
    rec.finished("stop", 4)
    labels = {"model": "llama", "pipeline": "P-RLD-MD"}
    assert value(registry, "pdd_router_requests_total", **labels, outcome="engine_error") == 1
    assert value(registry, "pdd_router_requests_total", **labels, outcome="stop") is None
    assert value(registry, "pdd_router_requests_in_flight", model="llama") == 0
    assert value(registry, "pdd_router_ttft_seconds_count", **labels, arm="arm-b") == 1
    assert value(registry, "pdd_router_inter_token_latency_seconds_count", **labels) == 3
    assert value(registry, "pdd_router_generation_tokens_total", **labels) == 5
    assert value(registry, "pdd_router_prompt_cached_tokens_total", **labels) is None


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ApiError(429, "over capacity", code="overloaded"), "rejected"),
        (ApiError(400, "cannot meet the limit", code="first_token_limit"), "rejected"),
        (ApiError(429, "engines busy", code="engine_busy"), "engine_busy"),
        (ApiError(503, "no engine"), "unavailable"),
        (ApiError(499, "the client closed the connection"), "abort"),
        (ApiError(400, "bad prompt", param="prompt"), "invalid_request"),
        (EngineError("md0", "refused", cause="request"), "invalid_request"),
        (asyncio.CancelledError(), "abort"),
        (RuntimeError("a bug"), "error"),
    ],
)
def test_failures_count_under_their_kind(exc: BaseException, kind: str) -> None:
    assert outcome_of(exc) == kind


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request"),
        (401, "unauthorized"),
        (403, "forbidden"),
        (404, "model_not_found"),
        (413, "too_large"),
        (422, "unprocessable"),
        (429, "rejected"),
        (503, "unavailable"),
        (500, "error"),
        (418, "error"),  # a status no refusal has: no series of its own
        (None, "abort"),  # no answer sent: the client left
    ],
)
def test_refusals_before_a_decision_count_under_their_kind(status: int | None, kind: str) -> None:
    assert refusal_outcome(status) == kind
    assert kind in OUTCOMES

"""The live service's decision log: decisions joined with outcomes from usage or KV events."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from service_support import PROMPT, VOCAB, Engines, make_client, register

from cli.app import main
from engine_sim.engine import SimEngine, SimEngineConfig
from engines_adapter.contract import (
    EngineAdapter,
    GenerateRequest,
    KVEventBatch,
    PrefillResult,
    TokenDelta,
)
from router.errors import UserError
from router.index.memory_index import MemoryPrefixIndex
from router.index.resilient_index import ResilientIndex
from router.predictor.dataset import read_logs
from router.service.app import create_app
from router.service.schemas import InstanceConfig
from router.settings import Settings

TOPOLOGY = (("p0", "p", "A"), ("rld0", "rld", "A"), ("md0", "md", "B"))
# the same prompt twice, then one sharing its first 20 blocks (320 tokens) only
PROMPTS = [PROMPT, PROMPT, PROMPT[:320] + [(5 * i + 1) % VOCAB for i in range(320)]]


class NoUsageSim(SimEngine):
    """A simulated engine whose usage carries no cached tokens (like vLLM without
    ``--enable-prompt-tokens-details``); it keeps what it would have reported."""

    def __init__(self, instance_id: str, config: SimEngineConfig, hidden: dict[str, int]) -> None:
        super().__init__(instance_id, config)
        self.hidden = hidden

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[TokenDelta, None]:
        async for delta in super().generate(request):
            if delta.cached_tokens is not None:
                self.hidden[request.request_id] = delta.cached_tokens
            yield delta.model_copy(update={"cached_tokens": None})


class NoUsageEngines(Engines):
    def __init__(self) -> None:
        super().__init__()
        self.hidden: dict[str, int] = {}

    def __call__(self, config: InstanceConfig, _: httpx.AsyncClient) -> EngineAdapter:
        engine = NoUsageSim(config.instance_id, SimEngineConfig(vocab_size=VOCAB), self.hidden)
        self.by_id[config.instance_id] = engine
        return engine


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def complete(client: TestClient, prompt: list[int], *, stream: bool) -> tuple[str, int | None]:
    """Send a completion; (the service's request id, the cached tokens its usage reports
    when the engine reported them; None when usage gives the router's prediction)."""
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": 8, "session_id": "s1"}
    if not stream:
        response = client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        cached = response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        source = response.json()["pdd"]["cached_tokens_source"]
        assert source in ("engine", "predicted")
        return response.json()["id"], cached if source == "engine" else None
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    events = []
    with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    cached = events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    source = events[-2]["pdd"]["cached_tokens_source"]
    return events[-1]["id"], cached if source == "engine" else None


def outcomes_in(path: Path) -> int:
    return sum(1 for r in records(path) if r["kind"] == "outcome")


def run(engines: Engines, path: Path) -> tuple[list[tuple[str, int | None]], list[dict[str, Any]]]:
    with make_client(engines, decision_log=str(path), kv_events_grace_s=0.05) as client:
        register(client, *TOPOLOGY)
        before = outcomes_in(path) if path.exists() else 0
        sent = [complete(client, p, stream=i == 1) for i, p in enumerate(PROMPTS)]
        # an outcome read from KV events waits the grace period for late events
        deadline = time.monotonic() + 10
        while outcomes_in(path) < before + len(PROMPTS) and time.monotonic() < deadline:
            time.sleep(0.02)
        # each line is in the file as soon as it is written, before shutdown
        written = records(path)
    assert records(path) == written
    return sent, written


def joined(lines: list[dict[str, Any]], request_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    decisions = [r for r in lines if r["kind"] == "decision" and r["id"] == request_id]
    outcomes = [r for r in lines if r["kind"] == "outcome" and r["id"] == request_id]
    assert len(decisions) == 1
    assert len(outcomes) == 1
    return decisions[0], outcomes[0]


def test_usage_outcomes_join_the_decisions_and_train(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    sent, lines = run(Engines(), path)
    assert [cached for _, cached in sent] == [0, 624, 320]  # as the sim engine reported them
    for n, (request_id, cached) in enumerate(sent):
        decision, outcome = joined(lines, request_id)
        assert cached is not None
        assert decision["features"]["md"]["instance"] == "md0"
        assert decision["t"] > 0
        assert outcome["source"] == "usage"
        assert outcome["instances"] == {"p": "p0", "md": "md0"}
        assert outcome["realized_hit"] == {"md": pytest.approx(cached / 640)}
        # the same hit read from the engine's KV events: the two sources agree
        assert outcome["events_hit"] == {"md": pytest.approx(cached / 640)}
        assert outcome["output_tokens"] == 8
        assert outcome["pipeline"] == "P-MD"
        assert outcome["session_id"] == "s1"
        # the session's earlier outputs fed its history
        assert (decision["history"] or {}).get("outputs_known", 0) == n
    first, second = (joined(lines, rid)[1]["realized_hit"]["md"] for rid, _ in sent[:2])
    assert first == 0.0
    assert second > 0

    data = read_logs([path])  # what `pdd-router predictor train` reads
    assert len(data) == 3
    assert list(data.tier) == ["md", "md", "md"]
    assert data.y.tolist() == pytest.approx([0.0, 624 / 640, 0.5])
    assert data.raw.tolist() == pytest.approx([0.0, 1.0, 0.5])  # the index's match


def test_kv_events_give_the_hit_when_usage_has_none(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    engines = NoUsageEngines()
    sent, lines = run(engines, path)
    assert [cached for _, cached in sent] == [None, None, None]
    hits = []
    for request_id, _ in sent:
        _, outcome = joined(lines, request_id)
        assert outcome["source"] == "kv-events"
        assert outcome["instances"] == {"p": "p0", "md": "md0"}
        # what the engine would have reported as cached tokens, read from its KV events
        assert outcome["realized_hit"]["md"] == pytest.approx(engines.hidden[request_id] / 640)
        hits.append(outcome["realized_hit"]["md"])
    assert hits == pytest.approx([0.0, 624 / 640, 0.5])
    assert read_logs([path]).y.tolist() == pytest.approx(hits)


def test_outcomes_still_waiting_for_kv_events_are_written_at_shutdown(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    engines = NoUsageEngines()
    with make_client(engines, decision_log=str(path), kv_events_grace_s=600) as client:
        register(client, *TOPOLOGY)
        sent = [complete(client, p, stream=False) for p in PROMPTS]
        assert outcomes_in(path) == 0  # each waits for late stored events
    lines = records(path)
    hits = [joined(lines, request_id)[1]["realized_hit"]["md"] for request_id, _ in sent]
    assert hits == pytest.approx([0.0, 624 / 640, 0.5])


class WarmUpRecordingEngines(Engines):
    """Simulated engines that keep the cached tokens of every prefill (MD's warm-ups)."""

    def __init__(self) -> None:
        super().__init__()
        self.prefilled: dict[str, int | None] = {}

    def __call__(self, config: InstanceConfig, client: httpx.AsyncClient) -> EngineAdapter:
        engine = super().__call__(config, client)
        prefill = engine.prefill

        async def recording(request: GenerateRequest, *, targets: int = 1) -> PrefillResult:
            result = await prefill(request, targets=targets)
            self.prefilled[request.request_id] = result.cached_tokens
            return result

        engine.prefill = recording  # type: ignore[method-assign]
        return engine


def test_after_a_handoff_mds_hit_comes_from_its_kv_events(tmp_path: Path) -> None:
    """MD's usage after a handoff counts the prompt its warm-up copy brought (all of it):
    the hit it had before is what the first warm-up found cached, which its events tell."""
    path = tmp_path / "live.jsonl"
    engines = WarmUpRecordingEngines()
    with make_client(engines, decision_log=str(path), policy={"wan_budget_s": 1e-9}) as client:
        register(client, *TOPOLOGY)
        # a prompt held whole on MD would go P-MD: a cold one, then one sharing half of it
        sent = [complete(client, p, stream=False) for p in (PROMPTS[0], PROMPTS[2])]
    lines = records(path)
    assert sent[0][1] == 640  # the usage says a cold prompt was all cached: no use as a hit
    hits = []
    for request_id, _ in sent:
        decision, outcome = joined(lines, request_id)
        assert decision["decision"]["pipeline"] == "P-RLD-MD"
        assert outcome["pipeline"] == "P-RLD-MD"
        assert outcome["source"] == "kv-events"
        warm_up = engines.prefilled[f"{request_id}-md0"]
        assert warm_up is not None
        assert outcome["realized_hit"] == {"md": pytest.approx(warm_up / 640)}
        hits.append(outcome["realized_hit"]["md"])
    assert hits == pytest.approx([0.0, 0.5])


def test_experiment_arms_log_to_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    arms = [
        {"name": "paper", "policy": "pdd"},
        {"name": "relay", "policy": "pdd", "params": {"wan_budget_s": 1e-9}},
    ]
    with make_client(Engines(), decision_log=str(path)) as client:
        register(client, *TOPOLOGY)
        created = client.post("/v1/experiments", json={"name": "x", "arms": arms})
        assert created.status_code == 201
        # the experiment's id is random and seeds the assignment: sessions are sent until
        # both arms had one (40 fair coin flips all alike: about 2e-12)
        ids, pipelines = [], set()
        for s in range(40):
            prompt = [(s * 31 + 7 * i) % VOCAB for i in range(320)]
            body = {"prompt": prompt, "max_tokens": 4, "session_id": f"s{s}"}
            answer = client.post("/v1/completions", json=body).json()
            ids.append(answer["id"])
            pipelines.add(answer["pdd"]["decided_pipeline"])
            if len(ids) >= 8 and len(pipelines) == 2:
                break
    lines = records(path)
    seen = set()
    for request_id in ids:
        decision, outcome = joined(lines, request_id)
        assert decision["experiment"] == created.json()["id"]
        seen.add(decision["arm"])
        relay = decision["arm"] == "relay"
        assert decision["decision"]["pipeline"] == ("P-RLD-MD" if relay else "P-MD")
        assert outcome["instances"]["md"] == "md0"
        assert outcome["source"] == ("kv-events" if relay else "usage")
    assert seen == {"paper", "relay"}
    assert len(read_logs([path])) == len(ids)


def test_a_log_that_cannot_be_opened_is_named(tmp_path: Path) -> None:
    path = tmp_path / "no-such-dir" / "live.jsonl"
    client = make_client(Engines(), decision_log=str(path))
    with pytest.raises(UserError, match=re.escape(f"cannot open decision log {path}")), client:
        pass


def test_a_request_decided_again_after_failover_joins_once(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    engines = Engines()
    with make_client(engines, decision_log=str(path)) as client:
        register(client, *TOPOLOGY, ("p1", "p", "A"))
        engines.by_id["p0"].faults.refuse = True
        request_id, cached = complete(client, PROMPT, stream=False)
    lines = records(path)
    decided = [r for r in lines if r["kind"] == "decision" and r["id"] == request_id]
    tried = [r["decision"]["p_instance"] for r in decided]
    assert tried == ["p0", "p1"]  # one line per attempt, under the service's request id
    assert [r["id"] for r in lines if r["kind"] == "outcome"] == [request_id]
    assert cached is not None
    data = read_logs([path])
    assert len(data) == 1  # the last decision, the one served, joins its outcome
    assert data.y.tolist() == [cached / 640]


def test_readiness_still_reports_a_degraded_shared_index(tmp_path: Path) -> None:
    """With a decision log the index is wrapped to track block ages; /readyz looks inside."""
    shared = ResilientIndex(MemoryPrefixIndex())
    settings = Settings(service={"vocab_size": VOCAB, "decision_log": str(tmp_path / "l.jsonl")})
    with TestClient(create_app(settings, index=shared, adapter_factory=Engines())) as client:
        assert client.get("/readyz").json()["index_degraded"] is False
        shared.degraded = True  # what an unreachable Redis does
        assert client.get("/readyz").json()["index_degraded"] is True


class LateEventsSim(SimEngine):
    """A simulated engine whose KV events reach the router 0.2 s late (as over ZMQ from a
    busy engine): a request's own stored events arrive after its response."""

    async def kv_events(self) -> AsyncGenerator[KVEventBatch, None]:
        async for batch in super().kv_events():
            await asyncio.sleep(0.2)
            yield batch


class LateEventsEngines(Engines):
    def __call__(self, config: InstanceConfig, _: httpx.AsyncClient) -> EngineAdapter:
        engine = LateEventsSim(config.instance_id, SimEngineConfig(vocab_size=VOCAB))
        self.by_id[config.instance_id] = engine
        return engine


@pytest.mark.parametrize("grace", [1.0, 0.0])
def test_the_outcome_line_waits_for_late_kv_events(tmp_path: Path, grace: float) -> None:
    path = tmp_path / "live.jsonl"
    engines = LateEventsEngines()
    with make_client(engines, decision_log=str(path), kv_events_grace_s=grace) as client:
        register(client, *TOPOLOGY)
        complete(client, PROMPTS[2], stream=False)  # md0 publishes a first event
        time.sleep(0.5)
        request_id, cached = complete(client, PROMPTS[0], stream=False)
        time.sleep(1.5)
    _, outcome = joined(records(path), request_id)
    assert cached == 320  # the half it shares with the first prompt
    assert outcome["realized_hit"] == {"md": pytest.approx(0.5)}
    # the same hit read from the KV events, once they have arrived
    expected = 0.5 if grace else 624 / 640  # without waiting, its own stores are missed
    assert outcome["events_hit"] == {"md": pytest.approx(expected)}


def test_history_ttft_and_arms_do_not_wait_for_the_outcome_line(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    arms = [
        {"name": "paper", "policy": "pdd"},
        {"name": "relay", "policy": "pdd", "params": {"wan_budget_s": 1e-9}},
    ]
    with make_client(Engines(), decision_log=str(path), kv_events_grace_s=600) as client:
        register(client, *TOPOLOGY)
        response = client.post("/v1/experiments", json={"name": "x", "arms": arms})
        assert response.status_code == 201, response.text
        created = response.json()
        ids = [complete(client, p, stream=False)[0] for p in PROMPTS]
        lines = records(path)
        assert not [r for r in lines if r["kind"] == "outcome"]  # every line still waits
        outputs = [next(r for r in lines if r.get("id") == i)["history"] for i in ids]
        assert [(h or {}).get("outputs_known", 0) for h in outputs] == [0, 1, 2]
        report = client.get(f"/v1/experiments/{created['id']}").json()
        assert sum(arm["requests"] for arm in report["arms"]) == len(PROMPTS)
        counts = [
            sample.value
            for family in text_string_to_metric_families(client.get("/metrics").text)
            for sample in family.samples
            if sample.name == "pdd_router_ttft_seconds_count"
        ]
        assert sum(counts) == len(PROMPTS)  # every TTFT observed already
    assert len([r for r in records(path) if r["kind"] == "outcome"]) == len(PROMPTS)


def test_a_restarted_service_appending_to_the_log_reuses_no_id(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    first = run(Engines(), path)[0]
    second = run(Engines(), path)[0]
    assert not {i for i, _ in first} & {i for i, _ in second}
    assert len(read_logs([path])) == 2 * len(PROMPTS)


def test_a_bad_setting_stops_serve_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PDD_ROUTER_SERVICE__KV_EVENTS_GRACE_S", "-1")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err]
    assert (
        "PDD_ROUTER_SERVICE__KV_EVENTS_GRACE_S: Input should be greater than or equal to 0" in err
    )


def _histogram(client: TestClient, name: str) -> tuple[float, float]:
    """(sum, count) of one of the router's histograms."""
    found = {
        sample.name: sample.value
        for family in text_string_to_metric_families(client.get("/metrics").text)
        for sample in family.samples
        if family.name == name
    }
    return found[f"{name}_sum"], found[f"{name}_count"]


@pytest.mark.parametrize("stream", [False, True])
def test_the_router_reports_its_own_time_apart_from_the_engines(stream: bool) -> None:
    """pdd_router_overhead_seconds: the router's time to first token less its waits on the
    engines. Engines that take 32 ms to prefill the prompt and 30 ms a decode step leave
    the router's own time a small part of the TTFT: both waits are taken out (with only
    the prefill's, the own time would be about half the TTFT)."""
    slow = {"prefill_s_per_token": 5e-5, "decode_s_per_token": 0.03}  # 640 tokens: 32 ms
    engines = Engines(p=slow, rld=slow, md=slow)
    with make_client(engines) as client:
        register(client, *TOPOLOGY)
        for i in range(3):
            complete(client, [(t + 97 * i) % VOCAB for t in PROMPT], stream=stream)
        ttft_sum, ttft_count = _histogram(client, "pdd_router_ttft_seconds")
        own_sum, own_count = _histogram(client, "pdd_router_overhead_seconds")
    assert own_count == ttft_count == 3
    assert ttft_sum / 3 > 0.06  # the prefill and a decode step are in the TTFT
    assert 0 < own_sum < 0.25 * ttft_sum, (own_sum, ttft_sum)

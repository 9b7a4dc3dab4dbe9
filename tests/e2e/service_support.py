"""Helpers shared by the service's end-to-end tests: simulated engines and a client."""

from __future__ import annotations

import json
from typing import Any

import httpx
from fastapi.testclient import TestClient

from engine_sim.engine import SimEngine, SimEngineConfig
from engines_adapter.contract import EngineAdapter
from router.service.app import create_app
from router.service.schemas import InstanceConfig
from router.settings import Settings

VOCAB = 512
PROMPT = [(7 * i + 3) % VOCAB for i in range(640)]  # 40 blocks of 16
TOPOLOGY = (("p0", "p", "A"), ("rld0", "rld", "A"), ("md0", "md", "B"))
"""One instance of each tier: P and RLD in datacenter A, MD in B."""


class Engines:
    """Builds one SimEngine per registered instance and keeps them for inspection."""

    def __init__(self, **overrides: Any) -> None:
        self.by_id: dict[str, SimEngine] = {}
        self.overrides = overrides

    def __call__(self, config: InstanceConfig, _: httpx.AsyncClient) -> EngineAdapter:
        fields: dict[str, Any] = {"vocab_size": VOCAB, "cache_blocks": 4096}
        fields.update(self.overrides.get(config.tier.value, {}))
        engine = SimEngine(config.instance_id, SimEngineConfig(**fields))
        self.by_id[config.instance_id] = engine
        return engine


def reference(prompt: list[int], n: int) -> list[int]:
    """What one engine alone produces for the prompt (greedy)."""
    import asyncio

    from engines_adapter.contract import GenerateRequest

    async def run() -> list[int]:
        engine = SimEngine("ref", SimEngineConfig(vocab_size=VOCAB))
        out: list[int] = []
        req = GenerateRequest(request_id="r", prompt_token_ids=prompt, max_tokens=n)
        async for delta in engine.generate(req):
            out.extend(delta.token_ids)
        return out

    return asyncio.run(run())


def make_client(
    engines: Engines,
    *,
    policy: dict[str, Any] | None = None,
    allow_unauthenticated_admin: bool = True,
    show_shared_predictions: bool = True,
    **service: Any,
) -> TestClient:
    """A service on simulated engines. Its admin API (registering instances, KV events,
    experiments) accepts requests without a key unless the test passes ``api_key=...``
    (then every endpoint but the health checks needs it) or
    ``allow_unauthenticated_admin=False`` (the default of a real deployment); requests
    without a cache salt are shown predicted hits unless ``show_shared_predictions=False``
    (the default of a real deployment)."""
    settings = Settings(
        service={"vocab_size": VOCAB, "load_poll_s": 0.05,
                 "allow_unauthenticated_admin": allow_unauthenticated_admin,
                 "show_shared_predictions": show_shared_predictions, **service},
        policy={"name": "pdd", "params": policy or {}},
    )  # fmt: skip
    return TestClient(create_app(settings, adapter_factory=engines))


def register(client: TestClient, *specs: tuple[str, str, str], key: str | None = None) -> None:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    for iid, tier, dc in specs:
        body = {"instance_id": iid, "tier": tier, "datacenter": dc, "adapter": "sim"}
        response = client.post("/v1/instances", json=body, headers=headers)
        assert response.status_code == 201, response.text


def sse_events(client: TestClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks of a streamed completion of ``body`` (which must be accepted)."""
    events = []
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events

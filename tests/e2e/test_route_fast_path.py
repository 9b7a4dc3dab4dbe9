"""POST /v1/route answered by the ASGI fast path is the endpoint's answer: same decisions,
same errors, same refusals, for the same requests on the same cluster."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_support import PROMPT, VOCAB, Engines, register

from router.service.app import create_app
from router.settings import Settings

KEY = "fast-key"
AUTH = {"authorization": f"Bearer {KEY}"}


def client(fast: bool, *, api_key: str | None = KEY) -> TestClient:
    service: dict[str, Any] = {"vocab_size": VOCAB, "load_poll_s": 3600, "route_fast_path": fast}
    if api_key is not None:
        service["api_key"] = api_key
    else:
        service["allow_unauthenticated_admin"] = True
    return TestClient(create_app(Settings(service=service), adapter_factory=Engines()))


def route(c: TestClient, body: Any, headers: dict[str, str] | None = AUTH) -> Any:
    """The test client's response (its own httpx's Response type, not httpx.Response)."""
    if isinstance(body, bytes):
        return c.post("/v1/route", content=body, headers={**(headers or {}),
                      "content-type": "application/json"})  # fmt: skip
    return c.post("/v1/route", json=body, headers=headers)


CASES: list[tuple[str, Any, dict[str, str] | None]] = [
    ("token ids", {"token_ids": PROMPT, "max_tokens": 16, "session_id": "s1"}, AUTH),
    ("same again: the session's history", {"token_ids": PROMPT, "session_id": "s1"}, AUTH),
    ("trace blocks", {"hash_ids": [11, 12, 13], "block_size": 512, "input_length": 1400}, AUTH),
    ("spaced JSON", b'{"token_ids": [1, 2, 3, 4], "max_tokens": 2}', AUTH),
    ("beyond the vocabulary", {"token_ids": [1, 2, VOCAB]}, AUTH),
    ("negative token", {"token_ids": [1, -2]}, AUTH),
    ("float token", {"token_ids": [1, 2.5]}, AUTH),
    ("both prompts", {"token_ids": [1], "hash_ids": [1], "block_size": 4}, AUTH),
    ("unknown field", {"token_ids": [1], "tokens": [1]}, AUTH),
    ("malformed JSON", b'{"token_ids": [1, 2', AUTH),
    ("max_tokens over the limit", {"token_ids": [1], "max_tokens": 10**9}, AUTH),
    ("no key", {"token_ids": [1, 2]}, None),
    ("wrong key", {"token_ids": [1, 2]}, {"authorization": "Bearer nope"}),
]


@pytest.mark.parametrize("with_instances", [True, False], ids=["cluster", "no-instances"])
def test_the_fast_path_answers_as_the_endpoint(
    with_instances: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The line's committed bytes drain in real time between decisions, so two runs a few
    # milliseconds apart predict different WAN times: the decisions' clock stands still.
    frozen = SimpleNamespace(monotonic=lambda: 1000.0, time=time.time,
                             perf_counter=time.perf_counter)  # fmt: skip
    monkeypatch.setattr("router.service.decide.time", frozen)
    answers = {}
    for fast in (True, False):
        with client(fast) as c:
            if with_instances:
                register(c, ("p0", "p", "A"), ("rld0", "rld", "A"), ("md0", "md", "B"),
                         key=KEY)  # fmt: skip
            answers[fast] = [route(c, body, headers) for _, body, headers in CASES]
    for (name, _, _), quick, full in zip(CASES, answers[True], answers[False], strict=True):
        assert (quick.status_code, quick.json()) == (full.status_code, full.json()), name
        assert quick.headers.get("www-authenticate") == full.headers.get("www-authenticate")
    codes = [r.status_code for r in answers[True]]
    assert codes[:4] == ([200] * 4 if with_instances else [503] * 3 + [503])
    assert codes[4:] == [400, 422, 422, 422, 422, 400, 400, 401, 401]


def test_without_a_key_the_fast_path_needs_none() -> None:
    with client(True, api_key=None) as c:
        register(c, ("p0", "p", "A"), ("md0", "md", "B"))
        assert route(c, {"token_ids": PROMPT}, headers=None).status_code == 200

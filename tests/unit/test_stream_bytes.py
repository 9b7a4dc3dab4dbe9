"""What a streaming client receives, byte for byte: the demo's service (the built-in
tokenizer, in-process simulated engines) streams completions and chats exactly as the
files under ``data/stream_bytes`` hold them, written by the service before its streams
were made cheaper (each case on a fresh service). Only the response's id and creation
time, which change with every run, are set to fixed values before comparing."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from router.service.demo import DEMO_MODEL, demo_app, demo_settings
from router.settings import Settings

DATA = Path(__file__).parent / "data" / "stream_bytes"
USAGE = {"include_usage": True}
CHAT = [{"role": "user", "content": "Tell me about prefix caches, in a few words."}]

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "completion_usage": ("/v1/completions", {"prompt": "Tell me about caches",
                                             "max_tokens": 12, "stream_options": USAGE}),
    "completion_stop": ("/v1/completions", {"prompt": "Tell me about caches",
                                            "max_tokens": 12, "stop": [" st"]}),
    "completion_logprobs": ("/v1/completions", {"prompt": "Caches", "max_tokens": 6,
                                                "logprobs": 2}),
    "completion_echo": ("/v1/completions", {"prompt": "Caches", "max_tokens": 6,
                                            "echo": True}),
    "chat_logprobs_usage": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 9,
                                                     "logprobs": True, "top_logprobs": 2,
                                                     "stream_options": USAGE}),
    "chat_length": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 40,
                                             "ignore_eos": True}),
}  # fmt: skip


def normalized(raw: bytes) -> bytes:
    """``raw`` with the response id's random part and the creation time fixed."""
    raw = re.sub(rb'"id":"pdd-[0-9a-f]+-\d+"', b'"id":"pdd-x"', raw)
    return re.sub(rb'"created":\d+', b'"created":0', raw)


@pytest.fixture
def client() -> Iterator[TestClient]:
    """A service of its own for each case: what the engines cached before is no part of it."""
    with TestClient(demo_app(demo_settings(Settings()))) as c:
        yield c


def streamed(client: TestClient, path: str, body: dict[str, Any]) -> bytes:
    with client.stream("POST", path, json={"model": DEMO_MODEL, "stream": True, **body}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        return normalized(b"".join(r.iter_bytes()))


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_stream_is_byte_for_byte_what_it_was(client: TestClient, case: str) -> None:
    path, body = CASES[case]
    assert streamed(client, path, body) == (DATA / f"{case}.sse").read_bytes()

"""Engine output is checked, against a real router process: an engine that answers with
token IDs outside the model's vocabulary gives a stream a clean error event and
``[DONE]`` (a JSON request a 502), never a 500 or a cut stream; numbers that are not
finite in fields passed to engines get 400 before they leave. The router stays
responsive meanwhile."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from process_support import Stack, free_port, spawn, wait_for

MODEL = "m"
GOOD = "good"


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Two models, both on the built-in tokenizer (512 tokens): ``good`` on engines that
    answer within it, ``m`` on engines whose token IDs run to 100,000."""
    stack = Stack(tmp_path_factory.mktemp("engine-output"))
    try:
        served = {"p0": GOOD, "md0": GOOD, "p1": MODEL, "md1": MODEL}
        for iid, model in served.items():
            vocab = ["--vocab-size", "100000"] if model == MODEL else []
            stack.engine(iid, iid[:-1], *vocab)
        for engine in stack.engines.values():
            wait_for(f"{engine.url}/health", stack.procs)
        instances = [
            {"instance_id": e.instance_id, "tier": e.tier, "adapter": "vllm", "url": e.url,
             "datacenter": "B" if e.tier == "md" else "A", "model": served[e.instance_id]}
            for e in stack.engines.values()
        ]  # fmt: skip
        (stack.folder / "instances.json").write_text(json.dumps(instances))
        models = [{"name": name, "tokenizer": {"builtin": True}} for name in (GOOD, MODEL)]
        env = {"PDD_ROUTER_POLICY__NAME": "idc-pd", "PDD_ROUTER_MODELS": json.dumps(models)}
        port, log = free_port(), stack.folder / "router.log"
        args = ["serve", "--port", str(port), "--instances", str(stack.folder / "instances.json"),
                "--log-level", "warning"]  # fmt: skip
        stack.procs.append((spawn(args, log, env), log))
        url = f"http://127.0.0.1:{port}"
        wait_for(f"{url}/readyz", stack.procs)
        yield url
    finally:
        stack.close()


def chat(max_tokens: int, model: str = MODEL, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": max_tokens, "ignore_eos": True, **extra}  # fmt: skip


def assert_responsive(router: str) -> None:
    """/healthz answers quickly and a request for the other model is served."""
    started = time.perf_counter()
    assert httpx.get(f"{router}/healthz", timeout=5).status_code == 200
    assert time.perf_counter() - started < 0.5  # generous: the machine is shared
    good = httpx.post(f"{router}/v1/chat/completions", json=chat(8, GOOD), timeout=10)
    assert good.status_code == 200, good.text
    assert good.json()["usage"]["completion_tokens"] == 8


def test_a_stream_with_token_ids_outside_the_vocabulary_ends_with_an_error_event(
    router: str,
) -> None:
    events: list[str] = []
    body = chat(16, stream=True)
    with httpx.stream("POST", f"{router}/v1/chat/completions", json=body, timeout=30) as answer:
        assert answer.status_code == 200
        events = [line[6:] for line in answer.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events
    error = json.loads(events[-2])["error"]
    assert error["type"] == "upstream_error"
    assert error["code"] == 502
    assert_responsive(router)


def test_a_request_with_token_ids_outside_the_vocabulary_gets_502(router: str) -> None:
    answer = httpx.post(f"{router}/v1/chat/completions", json=chat(16), timeout=30)
    assert answer.status_code == 502, answer.text
    assert answer.json()["error"]["message"] == "engine failed mid-request: the engine failed"
    assert_responsive(router)


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity"])
def test_a_field_for_the_engine_that_is_not_finite_gets_400_naming_it(
    router: str, text: str
) -> None:
    raw = json.dumps(chat(1)).replace('"max_tokens"', f'"top_p": {text}, "max_tokens"')
    headers = {"content-type": "application/json"}
    answer = httpx.post(f"{router}/v1/chat/completions", content=raw, headers=headers, timeout=10)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "top_p"
    assert "not finite" in error["message"]
    nested = {"model": MODEL, "prompt": "hi", "max_tokens": 1, "logit_bias": {"5": float("nan")}}
    raw = json.dumps(nested)  # Python writes NaN, as a hostile client may
    answer = httpx.post(f"{router}/v1/completions", content=raw, headers=headers, timeout=10)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "logit_bias"
    assert_responsive(router)

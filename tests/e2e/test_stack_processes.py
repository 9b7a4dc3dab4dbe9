"""The docker-compose stack without containers: three engine-sim servers and the router.

Every piece runs as its own process, as in production: the router drives the
engines through the vLLM adapter over HTTP and learns their caches from KV events
over ZMQ.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from process_support import free_port, spawn, wait_for

PROMPT = [(11 * i + 5) % 512 for i in range(480)]  # 30 blocks of 16


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("stack")
    engines = {"p0": ("p", []), "rld0": ("rld", ["--decode-ms", "3"]),
               "md0": ("md", ["--decode-ms", "3", "--prefill-us-per-token", "300"])}  # fmt: skip
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    instances = []
    urls = {}
    try:
        for iid, (tier, extra) in engines.items():
            port, events = free_port(), free_port()
            log = tmp / f"{iid}.log"
            args = [
                "engine-sim",
                "serve",
                "--tier",
                tier,
                "--port",
                str(port),
                "--instance-id",
                iid,
                "--kv-events-endpoint",
                f"tcp://*:{events}",
                *extra,
            ]
            procs.append((spawn(args, log), log))
            urls[iid] = f"http://127.0.0.1:{port}"
            instances.append({"instance_id": iid, "tier": tier, "adapter": "vllm",
                              "datacenter": "B" if tier == "md" else "A", "url": urls[iid],
                              "kv_events_endpoint": f"tcp://127.0.0.1:{events}"})  # fmt: skip
        for iid in engines:
            wait_for(f"{urls[iid]}/health", procs)
        (tmp / "instances.json").write_text(json.dumps(instances))
        port = free_port()
        env = {"PDD_ROUTER_POLICY__NAME": "pdd",
               "PDD_ROUTER_POLICY__PARAMS": json.dumps({"wan_budget_s": 1e-6}),
               "PDD_ROUTER_SERVICE__VOCAB_SIZE": "512",
               "PDD_ROUTER_SERVICE__SHOW_SHARED_PREDICTIONS": "true",
               "PDD_ROUTER_SERVICE__LOAD_POLL_S": "0.2"}  # fmt: skip
        log = tmp / "router.log"
        args = ["serve", "--port", str(port), "--instances", str(tmp / "instances.json"),
                "--log-level", "warning"]  # fmt: skip
        procs.append((spawn(args, log, env), log))
        urls["router"] = f"http://127.0.0.1:{port}"
        wait_for(f"{urls['router']}/readyz", procs)
        yield urls
    finally:
        for proc, _ in procs:
            proc.terminate()
        for proc, _ in procs:
            proc.wait(timeout=15)


def direct_output(url: str, prompt: list[int], n: int) -> list[int]:
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}  # fmt: skip
    tokens: list[int] = httpx.post(f"{url}/v1/completions", json=body, timeout=30).json()[
        "choices"
    ][0]["token_ids"]
    return tokens


def test_streamed_p_rld_md_request_through_real_processes(stack: dict[str, str]) -> None:
    body = {"prompt": PROMPT, "max_tokens": 120, "stream": True}
    chunks = []
    with httpx.stream("POST", f"{stack['router']}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["x-pdd-pipeline"] == "P-RLD-MD"
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    tokens = [t for c in chunks for choice in c["choices"] for t in choice["token_ids"]]
    assert tokens == direct_output(stack["p0"], PROMPT, 120)
    served = chunks[-1]["pdd"]
    assert served["pipeline"] == "P-RLD-MD"
    assert served["instances"] == {"p": "p0", "rld": "rld0", "md": "md0"}
    assert 0 < served["eager_tokens"] < 120


def test_kv_events_over_zmq_reach_the_router(stack: dict[str, str]) -> None:
    prompt = [(3 * i + 7) % 512 for i in range(320)]  # 20 blocks
    router = stack["router"]
    assert httpx.post(f"{router}/v1/completions", json={"prompt": prompt, "max_tokens": 2},
                      timeout=30).status_code == 200  # fmt: skip
    deadline = time.time() + 10
    # what the engine will serve from cache: whole blocks, never the prompt's last token
    engine_hit = (len(prompt) - 1) // 16 * 16 / len(prompt)
    hit = 0.0
    while time.time() < deadline and hit < engine_hit:
        decision = httpx.post(f"{router}/v1/route", json={"token_ids": prompt}).json()
        hit = decision["predicted_hit"]["md"]
        time.sleep(0.1)
    assert hit == pytest.approx(engine_hit)  # 304 of 320 tokens
    metrics = httpx.get(f"{router}/metrics").text
    assert 'pdd_router_kv_event_batches_total{instance="md0"}' in metrics

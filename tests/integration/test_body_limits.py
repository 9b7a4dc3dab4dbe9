"""Body limits and big bodies against a real uvicorn server: refused while streaming,
nothing buffered past the limit, the event loop free during a large KV-event batch (that
one against a router process of its own, as users run it: a server in the test's process
shares its interpreter lock and garbage collector with the test)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from e2e.loop_support import LOOP_HELD_S, LoopReading
from e2e.process_support import Stack, free_port, spawn, wait_for
from engine_sim.engine import SimEngine, SimEngineConfig
from router.service.app import create_app
from router.service.schemas import InstanceConfig
from router.settings import Settings

KEY = "limits-key"
AUTH = {"authorization": f"Bearer {KEY}"}
LIMIT = 1 << 20  # 1 MiB for the refusal tests
VOCAB = 512


def _sim(config: InstanceConfig, _: httpx.AsyncClient) -> SimEngine:
    return SimEngine(config.instance_id, SimEngineConfig(vocab_size=VOCAB))


def _serve(app: FastAPI) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    assert server.started
    url = f"http://127.0.0.1:{port}"
    for iid, tier, dc in (("p0", "p", "A"), ("rld0", "rld", "A"), ("md0", "md", "B")):
        body = {"instance_id": iid, "tier": tier, "datacenter": dc, "adapter": "sim"}
        httpx.post(f"{url}/v1/instances", json=body, headers=AUTH).raise_for_status()
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _app(max_body_bytes: int) -> FastAPI:
    settings = Settings(
        service={
            "vocab_size": VOCAB,
            "api_key": KEY,
            "max_body_bytes": max_body_bytes,
            "show_shared_predictions": True,
        }
    )
    return create_app(settings, adapter_factory=_sim)


@pytest.fixture(scope="module")
def small_limit() -> Iterator[str]:
    app = _app(LIMIT)

    @app.get("/boom", include_in_schema=False)
    async def boom() -> None:
        raise RuntimeError("a bug")

    yield from _serve(app)


@pytest.fixture(scope="module")
def router_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``pdd-router serve`` in a process of its own, on three simulated instances, with the
    default 8 MiB body limit."""
    folder = tmp_path_factory.mktemp("router")
    instances = [
        {"instance_id": iid, "tier": tier, "datacenter": dc, "adapter": "sim"}
        for iid, tier, dc in (("p0", "p", "A"), ("rld0", "rld", "A"), ("md0", "md", "B"))
    ]
    (folder / "instances.json").write_text(json.dumps(instances))
    port, log = free_port(), folder / "router.log"
    env = {
        "PDD_ROUTER_SERVICE__API_KEY": KEY,
        "PDD_ROUTER_SERVICE__VOCAB_SIZE": str(VOCAB),
        "PDD_ROUTER_SERVICE__SHOW_SHARED_PREDICTIONS": "true",
    }
    args = ["serve", "--port", str(port), "--instances", str(folder / "instances.json"),
            "--log-level", "warning"]  # fmt: skip
    stack = Stack(folder, procs=[(spawn(args, log, env), log)])
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(f"{url}/readyz", stack.procs)
        yield url
    finally:
        stack.close()


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_chunked_body_over_the_limit_is_refused_while_it_streams(small_limit: str) -> None:
    """A 200 MB chunked body: 413 once the limit is passed, the rest never read or kept,
    and /healthz answers promptly meanwhile."""
    sent = 0
    chunk = b"[" + b"1," * 32_000
    healthz: list[float] = []

    def body(client: httpx.Client) -> Iterator[bytes]:
        nonlocal sent
        while sent < 200_000_000:
            if len(healthz) < 8:  # while the body streams in, the service answers others
                start = time.perf_counter()
                assert client.get("/healthz").status_code == 200
                healthz.append(time.perf_counter() - start)
            sent += len(chunk)
            yield chunk

    rss_before = _rss_bytes()
    loop = LoopReading(small_limit, AUTH).start()
    with httpx.Client(base_url=small_limit, timeout=10) as other:
        response = httpx.post(
            f"{small_limit}/v1/completions", content=body(other), timeout=30,
            headers={**AUTH, "content-type": "application/json"},
        )  # fmt: skip
    grown = _rss_bytes() - rss_before
    loop.stop()
    print(f"\nchunked body: /healthz slowest {max(healthz) * 1e3:.1f} ms; {loop}")
    assert response.status_code == 413
    assert response.json()["error"] == {
        "message": f"request body over {LIMIT} bytes", "type": "invalid_request_error",
        "param": None, "code": 413,
    }  # fmt: skip
    assert sent < 32 * LIMIT, f"the client could send {sent} bytes after the limit"
    assert grown < 64 * 1024 * 1024, f"RSS grew by {grown / 1e6:.0f} MB"
    assert len(healthz) == 8
    assert loop.held.over(LOOP_HELD_S) == 0, loop


def test_declared_length_over_the_limit_is_refused_before_the_body(small_limit: str) -> None:
    """Content-Length over the limit: 413 at once, though no byte of the body was sent."""
    host, port = small_limit.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"authorization: Bearer {KEY}\r\ncontent-length: {LIMIT + 1}\r\n\r\n".encode()
        )
        status, body = _read_response(sock)
    assert status == 413
    assert json.loads(body)["error"]["code"] == 413


def test_limit_is_exact_for_chunked_bodies(small_limit: str) -> None:
    """A chunked body of exactly the limit reaches the handler (which refuses the over-long
    prompt with 400); one byte more is a 413."""
    prompt = json.dumps({"prompt": [1] * (LIMIT // 2 - 100)}, separators=(",", ":")).encode()
    exact = prompt + b" " * (LIMIT - len(prompt))

    def chunks(data: bytes) -> Iterator[bytes]:
        for i in range(0, len(data), 50_000):
            yield data[i : i + 50_000]

    def post(data: bytes) -> httpx.Response:
        return httpx.post(
            f"{small_limit}/v1/completions", content=chunks(data), timeout=30,
            headers={**AUTH, "content-type": "application/json"},
        )  # fmt: skip

    at_limit = post(exact)
    assert at_limit.status_code == 400
    assert at_limit.json()["error"]["param"] == "prompt"
    assert post(exact + b" ").status_code == 413


def _read_response(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(head.split(b" ")[1]), rest[:length]


def test_unexpected_error_is_a_json_500_on_a_connection_that_stays_open(small_limit: str) -> None:
    host, port = small_limit.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"GET /boom HTTP/1.1\r\nhost: x\r\n\r\n")
        status, body = _read_response(sock)
        assert status == 500
        assert json.loads(body) == {
            "error": {"message": "internal error", "type": "server_error", "param": None,
                      "code": 500}
        }  # fmt: skip
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")  # the same connection
        status, body = _read_response(sock)
        assert status == 200
        assert json.loads(body) == {"status": "ok"}


def _kv_batch(target_bytes: int) -> tuple[bytes, list[int]]:
    """A chain of BlockStored events (4 blocks of 16 tokens each) of about ``target_bytes``
    of JSON, and the token IDs of its first event."""
    events: list[dict[str, object]] = []
    parent: int | None = None
    h = 1_000_000
    size = 0
    first: list[int] = []
    while size < target_bytes:
        hashes = [h, h + 1, h + 2, h + 3]
        tokens = [(7 * (h + i)) % VOCAB for i in range(64)]
        first = first or tokens
        event: dict[str, object] = {
            "type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": 16, "lora_id": None, "medium": None,
        }  # fmt: skip
        events.append(event)
        size += len(json.dumps(event)) + 1
        parent, h = hashes[-1], h + 4
    return json.dumps({"instance_id": "md0", "events": events}).encode(), first


def test_large_kv_event_batch_leaves_the_event_loop_free(router_process: str) -> None:
    """While a 7.5 MB batch is decoded and applied, /healthz keeps answering: its worst
    latency is a small part of the batch's time (a blocked loop makes them equal), and the
    batch is applied (its first blocks now steer a route to the MD instance holding them)."""
    body, first_tokens = _kv_batch(7_500_000)
    loop = LoopReading(router_process, AUTH).start()  # /healthz asked by another process
    start = time.perf_counter()
    response = httpx.post(
        f"{router_process}/v1/kv-events", content=body, timeout=120,
        headers={**AUTH, "content-type": "application/json"},
    )  # fmt: skip
    seconds = time.perf_counter() - start
    loop.stop()
    route = httpx.post(f"{router_process}/v1/route", json={"token_ids": first_tokens},
                       headers=AUTH, timeout=60)  # fmt: skip
    assert response.status_code == 202
    print(f"kv-events batch {len(body) / 1e6:.1f} MB in {seconds:.2f} s; {loop}")
    assert len(loop.healthz.times_s) >= 5  # answered while the batch was in
    assert loop.held.over(LOOP_HELD_S) == 0, loop
    # the batch's first 64 tokens, as the engine would serve them: 48 (never the last token)
    assert route.json()["predicted_hit"]["md"] == pytest.approx(48 / 64)

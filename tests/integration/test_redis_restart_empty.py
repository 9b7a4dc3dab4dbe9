"""The service through a Redis that is killed and restarts empty; readiness with a tier down."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from e2e.loop_support import LOOP_HELD_S, LoopReading
from engine_sim.engine import SimEngine, SimEngineConfig
from engines_adapter.contract import EngineAdapter
from router.errors import UserError
from router.hashing import chain_hashes
from router.index.redis_index import RedisPrefixIndex
from router.service.app import create_app
from router.service.schemas import InstanceConfig
from router.settings import Settings

VOCAB = 512
PROMPT = [(7 * i + 3) % VOCAB for i in range(640)]  # 40 blocks of 16
KEY = "restart-key"
AUTH = {"authorization": f"Bearer {KEY}"}
TOPOLOGY = (("p0", "p", "A"), ("rld0", "rld", "A"), ("md0", "md", "B"))
OTHER_PROMPT = [(11 * i + 5) % VOCAB for i in range(320)]  # shares no block with PROMPT
RECOVERY_BOUND_S = 10.0


class RedisServer:
    """A private redis-server on a fixed port, without persistence: a restart is empty."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port: int = s.getsockname()[1]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        poll_until(lambda: _accepts(self.port), 10.0, "redis-server to accept connections")

    def kill(self) -> None:
        """SIGKILL by PID, as a crash: nothing is saved."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


def poll_until(done: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until ``done()`` held, polling every 20 ms; fails after ``timeout_s``."""
    start = time.perf_counter()
    while not done():
        if time.perf_counter() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)
    return time.perf_counter() - start


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (make test installs it)")
    server = RedisServer(binary)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Engines:
    """Simulated engines, one per registered instance, kept to inject faults."""

    def __init__(self) -> None:
        self.by_id: dict[str, SimEngine] = {}

    def __call__(self, config: InstanceConfig, _: httpx.AsyncClient) -> EngineAdapter:
        engine = SimEngine(config.instance_id, SimEngineConfig(vocab_size=VOCAB))
        self.by_id[config.instance_id] = engine
        return engine


def service(engines: Engines, **index: Any) -> TestClient:
    service = {"vocab_size": VOCAB, "load_poll_s": 0.05, "api_key": KEY,
               "show_shared_predictions": True}  # fmt: skip
    settings = Settings(service=service, **index)
    return TestClient(create_app(settings, adapter_factory=engines))


def register(client: TestClient) -> None:
    for iid, tier, dc in TOPOLOGY:
        body = {"instance_id": iid, "tier": tier, "datacenter": dc, "adapter": "sim"}
        response = client.post("/v1/instances", json=body, headers=AUTH)
        assert response.status_code == 201, response.text


def complete(client: TestClient, prompt: list[int]) -> Any:
    """The test client's response (its own httpx's Response type, not httpx.Response)."""
    return client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4}, headers=AUTH)


def degraded_gauge(client: TestClient) -> float:
    text = client.get("/metrics", headers=AUTH).text
    line = next(x for x in text.splitlines() if x.startswith("pdd_router_index_degraded "))
    return float(line.split()[1])


class SharedView:
    """What another replica reads from the shared index (None while Redis is not there)."""

    def __init__(self, url: str, prefix: str) -> None:
        self.index = RedisPrefixIndex(url, key_prefix=prefix, socket_timeout_s=0.5)

    def instances(self) -> list[str] | None:
        try:
            return [i.instance_id for i in self.index.instances()]
        except UserError:
            return None

    def match(self, chain: tuple[int, ...]) -> dict[str, int] | None:
        try:
            return self.index.match(chain)
        except UserError:
            return None


@pytest.mark.redis
@pytest.mark.parametrize("noticed", [True, False], ids=["outage-noticed", "silent-restart"])
def test_the_service_recovers_when_redis_restarts_empty(
    redis_server: RedisServer, noticed: bool
) -> None:
    """Killed and restarted without its data: completions keep succeeding, and within a
    bounded time the shared index holds the instances and the chains served before."""
    prefix = f"pdd-test:{uuid.uuid4().hex}"
    index = {"index": {"backend": "redis"}, "redis": {"url": redis_server.url,
                                                       "key_prefix": prefix}}  # fmt: skip
    chain = chain_hashes(PROMPT, 16, 0).hashes
    shared = SharedView(redis_server.url, prefix)
    with service(Engines(), **index) as client:
        register(client)
        first = complete(client, PROMPT)
        assert first.status_code == 200, first.text
        served = first.json()["pdd"]["instances"]
        held = {served["p"]: 40, served["md"]: 40}
        poll_until(lambda: _holds(shared.match(chain), held), 5.0, "KV events in Redis")
        assert degraded_gauge(client) == 0.0

        redis_server.kill()
        if noticed:
            during = complete(client, OTHER_PROMPT)
            assert during.status_code == 200, during.text  # decided from the local mirror
            assert degraded_gauge(client) == 1.0  # set by the index: no /readyz call yet
            end = time.perf_counter() + 0.5
            while time.perf_counter() < end:
                ready = client.get("/readyz")
                body = ready.json()
                assert ready.status_code == 200, body
                assert body["index_degraded"] is True, body  # never plainly ready
                assert "index" in body["degraded"], body
                time.sleep(0.05)

        restarted = time.perf_counter()
        redis_server.start()
        statuses: list[tuple[int, int]] = []

        def recovered() -> bool:
            statuses.append(
                (complete(client, PROMPT).status_code, client.get("/v1/instances",
                                                                  headers=AUTH).status_code)
            )  # fmt: skip
            return (
                sorted(shared.instances() or []) == ["md0", "p0", "rld0"]
                and _holds(shared.match(chain), held)
                and degraded_gauge(client) == 0.0
            )

        poll_until(recovered, RECOVERY_BOUND_S, "the shared index to be rebuilt")
        recovery_s = time.perf_counter() - restarted
        print(f"\nrecovery after an empty restart ({'noticed' if noticed else 'silent'}): "
              f"{recovery_s * 1000:.0f} ms over {len(statuses)} completions")  # fmt: skip
        assert set(statuses) == {(200, 200)}, statuses  # never a 503 or a 500 for a user

        listed = client.get("/v1/instances", headers=AUTH)
        assert listed.status_code == 200
        blocks = {i["instance_id"]: i["indexed_blocks"] for i in listed.json()}
        assert blocks[served["md"]] >= 40
        route = client.post("/v1/route", json={"token_ids": PROMPT}, headers=AUTH).json()
        # the chain from before, as the engine serves it: 624 of 640 (never the last token)
        assert route["predicted_hit"]["md"] == pytest.approx(624 / 640)
        ready = client.get("/readyz").json()
        assert ready["index_degraded"] is False
        assert ready["degraded"] == []


def _holds(found: dict[str, int] | None, expected: dict[str, int]) -> bool:
    return found is not None and all(found.get(i) == n for i, n in expected.items())


def wait_tier(client: TestClient, tier: str, healthy: bool) -> dict[str, Any]:
    bodies: list[dict[str, Any]] = []

    def seen() -> bool:
        bodies.append(client.get("/readyz").json())
        return bool(bodies[-1]["tiers"][tier] is healthy)

    poll_until(seen, 10.0, f"tier {tier} healthy={healthy}")
    return bodies[-1]


def test_ready_but_degraded_with_rld_down_and_not_ready_without_p() -> None:
    engines = Engines()
    with service(engines) as client:
        register(client)
        assert client.get("/readyz").json()["degraded"] == []
        engines.by_id["rld0"].faults.healthy = False
        wait_tier(client, "rld", healthy=False)
        ready = client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["ready"] is True
        assert ready.json()["degraded"] == ["rld"]
        served = complete(client, PROMPT)
        assert served.status_code == 200, served.text
        assert served.json()["pdd"]["pipeline"] == "P-MD"  # RLD is down: P-MD serves

        engines.by_id["p0"].faults.healthy = False
        wait_tier(client, "p", healthy=False)
        gone = client.get("/readyz")
        assert gone.status_code == 503
        assert gone.json()["ready"] is False


@pytest.mark.redis
def test_a_hung_redis_never_holds_the_event_loop(redis_server: RedisServer) -> None:
    """Redis frozen (SIGSTOP): completions go on (decided from the local mirror after the
    first call times out on the index's own lane) and /healthz answers at once throughout."""
    import threading

    import uvicorn

    settings = Settings(
        service={"vocab_size": VOCAB, "load_poll_s": 0.05, "api_key": KEY},
        index={"backend": "redis"},
        redis={"url": redis_server.url, "key_prefix": f"pdd-hung:{uuid.uuid4().hex}"},
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(settings, adapter_factory=Engines())
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    poll_until(lambda: server.started, 20.0, "the service to start")
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, headers=AUTH, timeout=30) as client:
            for iid, tier, dc in TOPOLOGY:
                body = {"instance_id": iid, "tier": tier, "datacenter": dc, "adapter": "sim"}
                client.post("/v1/instances", json=body).raise_for_status()
            request = {"prompt": PROMPT, "max_tokens": 4}
            assert client.post("/v1/completions", json=request).status_code == 200
            assert redis_server.proc is not None
            redis_server.proc.send_signal(signal.SIGSTOP)
            codes: list[int] = []

            def traffic() -> None:
                with httpx.Client(base_url=base, headers=AUTH, timeout=30) as other:
                    for i in range(15):
                        prompt = [(t + i) % VOCAB for t in OTHER_PROMPT]
                        codes.append(other.post("/v1/completions", json={"prompt": prompt,
                                                "max_tokens": 4}).status_code)  # fmt: skip

            loop = LoopReading(base, AUTH).start()
            sender = threading.Thread(target=traffic)
            sender.start()
            waits = []
            with httpx.Client(timeout=5) as probe:  # one client: its setup is not timed
                while sender.is_alive():
                    start = time.perf_counter()
                    assert probe.get(f"{base}/healthz").status_code == 200
                    waits.append(time.perf_counter() - start)
                    time.sleep(0.01)
            sender.join()
            loop.stop()
            print(f"\nhung Redis: /healthz worst {max(waits) * 1e3:.1f} ms over {len(waits)} "
                  f"calls; {loop}")  # fmt: skip
            assert codes == [200] * 15
            # an index call waits 0.25 s for its socket timeout, on the index's lane: the
            # event loop (and /healthz) never waits for one
            assert loop.held.over(LOOP_HELD_S) == 0, loop
    finally:
        if redis_server.proc is not None:
            redis_server.proc.send_signal(signal.SIGCONT)
        server.should_exit = True
        thread.join(timeout=10)
